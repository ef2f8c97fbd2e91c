//! Every relative link in the repository's Markdown resolves: the file or folder it names exists,
//! and an `#anchor` names a heading of the target (GitHub's heading slugs) or an explicit
//! `id`/`name` in it. Links inside fenced code blocks and inline code are not links. Links with
//! a scheme (`https:`, `mailto:`) are not checked: this test needs no network.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Folders never walked: build outputs, virtualenvs, dependencies, version control.
const SKIPPED_DIRS: &[&str] = &[
    "target",
    "node_modules",
    "build",
    "dist",
    "__pycache__",
    "venv",
];

#[test]
fn every_relative_link_in_the_markdown_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    collect_markdown(root, &mut files);
    files.sort();
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "no Markdown found under {}",
        root.display()
    );

    let mut anchors: BTreeMap<PathBuf, HashSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("read Markdown");
        for link in links(&text) {
            if let Err(why) = check(root, file, &link.target, &mut anchors) {
                broken.push(format!(
                    "{}:{}: ({}) {}",
                    file.strip_prefix(root).unwrap_or(file).display(),
                    link.line,
                    link.target,
                    why
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken link(s) in {} Markdown files:\n{}",
        broken.len(),
        files.len(),
        broken.join("\n")
    );
}

fn collect_markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            if name.starts_with('.') || SKIPPED_DIRS.contains(&name.as_str()) {
                continue;
            }
            collect_markdown(&path, out);
        } else if kind.is_file() && name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// Checks one link target written in `file`.
fn check(
    root: &Path,
    file: &Path,
    target: &str,
    anchors: &mut BTreeMap<PathBuf, HashSet<String>>,
) -> Result<(), String> {
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let path = percent_decode(path);
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else if let Some(from_root) = path.strip_prefix('/') {
        root.join(from_root)
    } else {
        file.parent().unwrap_or(root).join(&path)
    };
    let resolved = normalize(&resolved);
    if !resolved.exists() {
        return Err("no such file".into());
    }
    let Some(anchor) = anchor else {
        return Ok(());
    };
    if anchor.is_empty() || !resolved.is_file() {
        return Ok(());
    }
    let is_markdown = resolved.extension().is_some_and(|e| e == "md");
    if !is_markdown {
        // Anchors into source files (GitHub's #L10 line links) are not checked.
        return Ok(());
    }
    let known = anchors.entry(resolved.clone()).or_insert_with(|| {
        let text = fs::read_to_string(&resolved).unwrap_or_default();
        heading_anchors(&text)
    });
    if known.contains(&percent_decode(anchor).to_lowercase()) {
        Ok(())
    } else {
        Err(format!("no heading with anchor #{anchor}"))
    }
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(hex) = std::str::from_utf8(&bytes[i + 1..i + 3])
            && let Ok(v) = u8::from_str_radix(hex, 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A link found in Markdown text: its target and the line it is on (1-based).
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    target: String,
}

/// The relative links of a Markdown text: inline links and images `[text](target)`, and
/// reference definitions `[label]: target`, outside fenced code blocks and inline code.
fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = strip_inline_code(line);
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix('[')
            && let Some(end) = rest.find("]:")
            && !rest[..end].contains('[')
        {
            let target = rest[end + 2..].split_whitespace().next().unwrap_or("");
            push_if_relative(&mut out, n, target);
            continue;
        }
        let mut from = 0;
        while let Some(at) = line[from..].find("](") {
            let start = from + at + 2;
            let Some(len) = closing_paren(&line[start..]) else {
                break;
            };
            let inner = line[start..start + len].trim();
            let target = match inner.strip_prefix('<') {
                Some(bracketed) => bracketed.split('>').next().unwrap_or(""),
                None => inner.split_whitespace().next().unwrap_or(""),
            };
            push_if_relative(&mut out, n, target);
            from = start + len;
        }
    }
    out
}

fn push_if_relative(out: &mut Vec<Link>, line: usize, target: &str) {
    if target.is_empty() {
        return;
    }
    let scheme = target
        .split(['/', '#', '?'])
        .next()
        .is_some_and(|head| head.contains(':'));
    if scheme {
        return;
    }
    out.push(Link {
        line,
        target: target.to_string(),
    });
}

/// Where the parenthesis that closes a link target is, counting nested pairs.
fn closing_paren(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// The lines outside fenced code blocks, with their 1-based numbers. A fence may be indented
/// any amount (inside a list item it is).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let body = line.trim_start_matches(' ');
        let marker = body.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |m| body.chars().take_while(|c| *c == m).count());
        match fence {
            Some((m, len)) => {
                if marker == Some(m) && run >= len && body[run..].trim().is_empty() {
                    fence = None;
                }
            }
            None if run >= 3 => fence = marker.map(|m| (m, run)),
            None => out.push((i + 1, line)),
        }
    }
    out
}

/// The line with every inline code span (a run of backticks up to the next run of the same
/// length) blanked out.
fn strip_inline_code(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let r = chars[j..].iter().take_while(|c| **c == '`').count();
                if r == run {
                    close = Some(j + r);
                    break;
                }
                j += r;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                out.push(' ');
                i = end;
            }
            None => {
                for _ in 0..run {
                    out.push('`');
                }
                i += run;
            }
        }
    }
    out
}

/// Every anchor a Markdown file offers: its ATX headings' slugs (a repeated slug gets `-1`,
/// `-2`, ... as on GitHub) and explicit `id="..."` / `name="..."` attributes.
fn heading_anchors(text: &str) -> HashSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = HashSet::new();
    for (_, line) in prose_lines(text) {
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                let value = &rest[at + attr.len()..];
                if let Some(end) = value.find('"') {
                    out.insert(value[..end].to_lowercase());
                }
                rest = &rest[at + attr.len()..];
            }
        }
        let Some(title) = atx_heading(line) else {
            continue;
        };
        let base = slug(&title);
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        };
        *count += 1;
        out.insert(anchor);
    }
    out
}

/// The text of an ATX heading (`## Title ##`), or `None` for any other line.
fn atx_heading(line: &str) -> Option<String> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let body = line.trim_start_matches(' ');
    let level = body.chars().take_while(|c| *c == '#').count();
    if level == 0 || level > 6 {
        return None;
    }
    let rest = &body[level..];
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return None;
    }
    let title = rest.trim().trim_end_matches('#').trim_end();
    Some(rendered_text(title))
}

/// What a heading shows: links reduced to their text, code spans to their content.
fn rendered_text(title: &str) -> String {
    let mut out = String::new();
    let mut rest = title;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find("](") else {
            break;
        };
        let Some(len) = closing_paren(&after[close + 2..]) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&after[..close]);
        rest = &after[close + 2 + len + 1..];
    }
    out.push_str(rest);
    out
}

/// GitHub's heading slug: lower case; letters, digits, `_` and `-` kept; each space a `-`;
/// everything else (punctuation, backticks, emphasis marks) dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn the_slug_rule_is_githubs() {
    assert_eq!(slug("What is durable when"), "what-is-durable-when");
    assert_eq!(slug("The `eventspool` command"), "the-eventspool-command");
    assert_eq!(
        slug("What exactly-once means, and where the window ends"),
        "what-exactly-once-means-and-where-the-window-ends"
    );
    assert_eq!(
        slug("Kotlin (JVM, or Android without the integration)"),
        "kotlin-jvm-or-android-without-the-integration"
    );
    assert_eq!(slug("Android: the five lines"), "android-the-five-lines");
    assert_eq!(slug("snake_case and 2-core"), "snake_case-and-2-core");
    assert_eq!(slug("a — b"), "a--b");
    assert_eq!(slug("Ünïcode Straße"), "ünïcode-straße");
    assert_eq!(slug("**Bold** and *em*"), "bold-and-em");

    let anchors = heading_anchors("# Title\n## Notes\n### Notes\n#### Notes #\n#hashtag\n");
    for a in ["title", "notes", "notes-1", "notes-2"] {
        assert!(anchors.contains(a), "{a} in {anchors:?}");
    }
    assert!(!anchors.contains("hashtag"), "`#hashtag` is no heading");
    let linked = heading_anchors("## See [the protocol](docs/protocol.md) first\n");
    assert!(linked.contains("see-the-protocol-first"), "{linked:?}");
}

#[test]
fn links_inside_code_are_ignored() {
    let text = "\
See [a](a.md) and `[b](b.md)` and ``[c](c.md) ` x`` here.
```sh
echo [d](d.md)
```
~~~
[e](e.md)
~~~
    ```rust
    let x = [f](f.md);
    ```
[g]: g.md
[h](https://example.com/h.md) [i](#local) [j](<j k.md> \"title\") ![k](img/k.png)
";
    let found: Vec<String> = links(text).into_iter().map(|l| l.target).collect();
    assert_eq!(found, ["a.md", "g.md", "#local", "j k.md", "img/k.png"]);
    let lines: Vec<usize> = links(text).into_iter().map(|l| l.line).collect();
    assert_eq!(lines, [1, 11, 12, 12, 12]);
}
