//! What the app sees of the collector's steering through the FFI, against the real reference
//! collector: the directive in force (id, fields, expiry) and the verb that ends it, the
//! directive counts, and the install id, gone while consent is denied.

use eventspool_collector::{Behavior, CollectorConfig, ReferenceCollector};
use eventspool_ffi::{Consent, EventSpool, SpoolConfig};

#[test]
fn stats_show_the_directive_in_force_the_counts_and_the_install_id() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).expect("collector");
    collector.set_behavior(Behavior {
        directives: Some(serde_json::json!({
            "id": "fix-7", "ttl_ms": 600_000, "drop_names": ["spam"],
            "sample_rate": {"debug_": 0.25}, "delete_queue": true
        })),
        ..Behavior::default()
    });
    let config = SpoolConfig {
        endpoint: collector.url(),
        min_batch_interval_ms: Some(0),
        flush_at: Some(1),
        ..SpoolConfig::default()
    };
    let spool = EventSpool::new(config, None, None, false).unwrap();
    spool.track("hello".into(), "{}".into()).unwrap();
    assert!(spool.wait_drained(30_000), "did not drain");
    let stats = spool.stats();
    assert_eq!(stats.directives_applied, 1, "{stats:?}");
    assert_eq!(stats.directives_ignored, 1, "the unknown member: {stats:?}");
    let d = stats.directive.expect("a directive in force");
    assert_eq!(d.id, "fix-7");
    assert_eq!(d.drop_names, vec!["spam".to_string()]);
    assert_eq!(d.sample_rate.get("debug_"), Some(&0.25));
    assert!(d.expires_in_ms > 0 && d.expires_in_ms <= 600_000, "{d:?}");
    let install = stats.install_id.expect("an install id while granted");
    assert_eq!(install.len(), 32);

    collector.set_behavior(Behavior::default());
    assert!(spool.track("spam".into(), "{}".into()).is_err());
    assert!(spool.clear_directive().unwrap());
    assert_eq!(spool.stats().directive, None);
    assert!(spool.track("spam".into(), "{}".into()).is_ok());

    spool.set_consent(Consent::Denied).unwrap();
    assert_eq!(
        spool.stats().install_id,
        None,
        "a denial deletes the install id"
    );
    spool.set_consent(Consent::Granted).unwrap();
    let again = spool
        .stats()
        .install_id
        .expect("a new id after a new grant");
    assert_ne!(again, install);
    spool.shutdown(5_000).unwrap();
}
