//! What a check concludes: pass, fail (with the fix) or not applicable, and what the collector
//! did, in words.

use super::context::Ctx;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grade {
    Pass,
    Fail,
    /// The check could not apply to this collector (nothing to see, or an option not given).
    NotApplicable,
}

impl Grade {
    pub fn as_str(self) -> &'static str {
        match self {
            Grade::Pass => "pass",
            Grade::Fail => "fail",
            Grade::NotApplicable => "n/a",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Verdict {
    pub grade: Grade,
    /// What the collector did, in one or two sentences.
    pub did: String,
    /// On a failure, what to change in the collector.
    pub fix: Option<String>,
}

impl Verdict {
    pub fn pass(did: impl Into<String>) -> Verdict {
        Verdict {
            grade: Grade::Pass,
            did: did.into(),
            fix: None,
        }
    }

    pub fn fail(did: impl Into<String>, fix: impl Into<String>) -> Verdict {
        Verdict {
            grade: Grade::Fail,
            did: did.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn not_applicable(did: impl Into<String>) -> Verdict {
        Verdict {
            grade: Grade::NotApplicable,
            did: did.into(),
            fix: None,
        }
    }
}

/// What a check returns: its verdict, or `Err` with one that ends it early (a failure).
pub type Judged = Result<Verdict, Verdict>;

/// Asks the read-back hook whether each of `ids` is stored exactly once. `Ok` carries a note
/// for the report ("read back: 5 of 5 stored once", or that nothing was read back); `Err` the
/// failure.
pub fn stored_once(ctx: &Ctx, ids: &[&str], what: &str) -> Result<String, Verdict> {
    let Some(result) = ctx.stored(ids) else {
        return Ok("not read back (no --verify-cmd)".into());
    };
    let stored = result.map_err(|e| {
        Verdict::fail(
            e,
            "make --verify-cmd print the stored ids, one `EVENT_ID [COUNT]` per line (docs/cli.md)",
        )
    })?;
    let missing: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !stored.contains_key(*id))
        .collect();
    let twice: Vec<(&str, u64)> = ids
        .iter()
        .filter_map(|id| stored.get(*id).filter(|&&n| n > 1).map(|&n| (*id, n)))
        .collect();
    if let Some(first) = missing.first() {
        return Err(Verdict::fail(
            format!(
                "{what}: {} of {} not stored by the read-back (first: {first})",
                missing.len(),
                ids.len()
            ),
            "store every event a 2xx answer covers, or list it in rejected: the SDK deletes what a \
             2xx covers",
        ));
    }
    if let Some((id, n)) = twice.first() {
        return Err(Verdict::fail(
            format!(
                "{what}: {} of {} stored more than once by the read-back ({id}: {n} copies)",
                twice.len(),
                ids.len()
            ),
            "store each event once by event_id: the SDK resends the same ids after any doubt",
        ));
    }
    Ok(format!(
        "read back: {} of {} stored once",
        ids.len(),
        ids.len()
    ))
}
