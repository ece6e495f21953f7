//! room-service's configuration rules, one test each.

use std::collections::BTreeSet;

use super::*;

fn parse(yaml: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(yaml, std::iter::empty(), &|_| None)
}

fn problems(yaml: &str) -> Vec<String> {
    parse(yaml).expect_err("config should be refused").problems
}

const SINK: &str = "sink:\n  name: fake\n  plugin: fake.wasm\n";

#[test]
fn an_empty_file_gets_room_services_defaults() {
    let config = parse("").unwrap();
    let w = &config.worker;
    assert!(w.enabled);
    assert_eq!(w.poll_interval, Duration::from_secs(1));
    assert_eq!(w.batch_size, 100);
    assert_eq!(w.publish_timeout, Duration::from_secs(3));
    assert_eq!(w.retry_interval, Duration::from_secs(1));
    assert_eq!(w.max_attempts, 0);
    assert_eq!(config.database.url, "sqlite://outbox.db");
    assert_eq!(config.table, "room_outbox");
    assert_eq!(config.admin.listen, Some("127.0.0.1:9464".parse().unwrap()));
    assert!(config.sinks.is_empty());
    assert!(config.require_sinks("run").is_err());
}

#[test]
fn room_services_example_block_is_accepted() {
    let yaml = format!(
        "outbox_worker:\n  enabled: true\n  poll_interval: \"1s\"\n  batch_size: 100\n  publish_timeout: \"3s\"\n  retry_strategy: \"fixed_interval\"\n{SINK}"
    );
    let config = parse(&yaml).unwrap();
    assert_eq!(config.worker.batch_size, 100);
    assert_eq!(config.require_sinks("run").unwrap()[0].name(), "fake");
}

#[test]
fn non_positive_interval_size_and_timeout_fall_back_to_defaults() {
    let config = parse("outbox_worker:\n  poll_interval: 0s\n  batch_size: -5\n  publish_timeout: \"-1s\"\n").unwrap();
    assert_eq!(config.worker.poll_interval, DEFAULT_POLL_INTERVAL);
    assert_eq!(config.worker.batch_size, DEFAULT_BATCH_SIZE);
    assert_eq!(config.worker.publish_timeout, DEFAULT_PUBLISH_TIMEOUT);
    assert_eq!(config.notes.len(), 3, "each fallback is noted: {:?}", config.notes);
    assert!(config.notes[0].starts_with("outbox_worker.poll_interval"));
}

#[test]
fn an_empty_retry_strategy_is_the_fixed_interval() {
    assert!(parse("outbox_worker:\n  retry_strategy: \"\"\n").is_ok());
}

#[test]
fn an_unknown_retry_strategy_refuses_to_start() {
    let p = problems("outbox_worker:\n  retry_strategy: fibonacci\n");
    assert_eq!(p, vec!["outbox_worker.retry_strategy: \"fibonacci\" is not one of fixed_interval, exponential"]);
}

#[test]
fn exponential_backoff_reads_its_base_and_ceiling() {
    let config =
        parse("outbox_worker:\n  retry_strategy: exponential\n  retry_interval: 500ms\n  max_retry_interval: 1m\n")
            .unwrap();
    assert_eq!(config.worker.retry_strategy, RetryStrategy::Exponential);
    assert_eq!(config.worker.retry_interval, Duration::from_millis(500));
    assert_eq!(config.worker.max_retry_interval, Duration::from_secs(60));
    assert_eq!(parse("").unwrap().worker.retry_strategy, RetryStrategy::FixedInterval, "the seed's default");
    let p = problems("outbox_worker:\n  retry_interval: 10s\n  max_retry_interval: 5s\n");
    assert_eq!(p, vec!["outbox_worker.max_retry_interval: 5s is shorter than retry_interval (10s)"]);
}

#[test]
fn a_rate_limit_reads_per_second_minute_or_hour_with_a_burst() {
    let limit = |extra: &str| parse(&format!("{SINK}{extra}")).unwrap().sinks[0].worker.rate_limit;
    assert_eq!(limit(""), None);
    assert_eq!(limit("  rate_limit: 200/s\n"), Some(RateLimit { per_second: 200.0, burst: 20 }));
    assert_eq!(limit("  rate_limit: 600/m\n  rate_burst: 3\n"), Some(RateLimit { per_second: 10.0, burst: 3 }));
    assert_eq!(limit("  rate_limit: 36/h\n"), Some(RateLimit { per_second: 0.01, burst: 1 }));
    for bad in ["rate_limit: 200", "rate_limit: 0/s", "rate_limit: -5/s", "rate_limit: 5/day", "rate_burst: 4"] {
        let p = problems(&format!("{SINK}  {bad}\n"));
        assert_eq!(p.len(), 1, "{bad}: {p:?}");
        assert!(p[0].starts_with(&format!("sink.{}:", bad.split(':').next().unwrap())), "{bad}: {p:?}");
    }
}

#[test]
fn a_rate_limit_section_sets_a_rate_per_sink_and_per_room() {
    let worker = |extra: &str| parse(&format!("{SINK}{extra}")).unwrap().sinks[0].worker.clone();
    let w = worker("  rate_limit:\n    per_room: 10/s\n    per_room_burst: 2\n");
    assert_eq!((w.rate_limit, w.room_rate_limit), (None, Some(RateLimit { per_second: 10.0, burst: 2 })));
    let w = worker("  rate_limit:\n    per_sink: 200/s\n    burst: 5\n    per_room: 600/m\n");
    assert_eq!(
        (w.rate_limit, w.room_rate_limit),
        (Some(RateLimit { per_second: 200.0, burst: 5 }), Some(RateLimit { per_second: 10.0, burst: 1 }))
    );
    assert_eq!(worker("  rate_limit: 200/s\n").room_rate_limit, None, "a rate alone is the sink's");
    let p = problems(&format!(
        "{SINK}  rate_burst: 3\n  rate_limit:\n    per_room: 10\n    per_room_burst: 0\n    per_rooms: 5/s\n"
    ));
    for key in ["sink.rate_burst:", "sink.rate_limit.per_room:", "sink.rate_limit.per_rooms"] {
        assert!(p.iter().any(|m| m.starts_with(key)), "{key} named: {p:?}");
    }
    let p = problems(&format!("outbox_worker:\n  ordering: none\n{SINK}  rate_limit:\n    per_room: 10/s\n"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("sink.rate_limit.per_room: needs ordering: per_room"), "{p:?}");
}

#[test]
fn unknown_keys_are_errors_at_every_level() {
    let p = problems(
        "outbox_workr:\n  enabled: true\noutbox_worker:\n  batchsize: 5\nsink:\n  name: a\n  plugin: a.wasm\n  alowed_hosts: []\n",
    );
    assert!(p.iter().any(|p| p.starts_with("outbox_workr:")), "{p:?}");
    assert!(p.iter().any(|p| p.starts_with("outbox_worker.batchsize:")), "{p:?}");
    assert!(p.iter().any(|p| p.starts_with("sink.alowed_hosts:")), "{p:?}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let p = problems(
        "outbox_worker:\n  retry_strategy: nope\n  poll_interval: soon\noutbox:\n  table: \"drop table\"\nadmin:\n  listen: everywhere\nsink:\n  name: \"\"\n",
    );
    for key in [
        "outbox_worker.retry_strategy",
        "outbox_worker.poll_interval",
        "outbox.table",
        "admin.listen",
        "sink.name",
        "sink.plugin",
    ] {
        assert!(p.iter().any(|p| p.starts_with(&format!("{key}:"))), "{key} missing from {p:?}");
    }
}

#[test]
fn the_table_must_be_an_identifier() {
    assert!(parse("outbox:\n  table: events_2\n").is_ok());
    for bad in ["\"room outbox\"", "\"1st\"", "\"a;drop\"", "\"x-y\""] {
        let p = problems(&format!("outbox:\n  table: {bad}\n"));
        assert!(p[0].starts_with("outbox.table:"), "{bad}: {p:?}");
    }
}

#[test]
fn a_mixed_case_table_is_refused_naming_its_lower_case_spelling() {
    let p = problems("outbox:\n  table: RoomOutbox\n");
    assert_eq!(p, ["outbox.table: \"RoomOutbox\" has upper-case letters: use lower case (\"roomoutbox\")"]);
}

#[test]
fn a_lease_shorter_than_a_batch_is_refused() {
    let p = problems(
        "outbox_worker:\n  batch_size: 100\n  concurrency: 10\n  publish_timeout: 3s\n  lease_duration: 10s\n",
    );
    assert!(p[0].starts_with("outbox_worker.lease_duration:"), "{p:?}");
    assert!(p[0].contains("at least 35s"), "{p:?}");
    let ok =
        parse("outbox_worker:\n  batch_size: 100\n  concurrency: 10\n  publish_timeout: 3s\n  lease_duration: 35s\n")
            .unwrap();
    assert_eq!(ok.worker.lease, Duration::from_secs(35));
}

#[test]
fn the_default_lease_covers_the_batch() {
    let config = parse("outbox_worker:\n  batch_size: 1000\n  concurrency: 4\n  publish_timeout: 2s\n").unwrap();
    assert_eq!(config.worker.lease, Duration::from_secs(250 * 2 + 5));
}

#[test]
fn database_urls_must_name_a_known_database() {
    assert!(parse("database:\n  url: postgres://u:secret@db/outbox\n").is_ok());
    let p = problems("database:\n  url: \"redis://u:secret@cache\"\n");
    assert!(p[0].starts_with("database.url:"), "{p:?}");
    assert!(!p[0].contains("secret"), "the password leaked: {p:?}");
}

#[test]
fn env_placeholders_fill_values_and_missing_ones_are_named() {
    let yaml = format!("{SINK}  config:\n    secret_key: \"${{TIM_KEY}}\"\n    region: \"${{REGION}}-1\"\n");
    let env = |name: &str| (name == "TIM_KEY").then(|| "s3cret".to_string());
    let err = Config::from_yaml(&yaml, std::iter::empty(), &env).unwrap_err();
    assert_eq!(err.problems, vec!["sink.config.region: environment variable REGION is not set".to_string()]);

    let env = |name: &str| Some(format!("{name}-value"));
    let config = Config::from_yaml(&yaml, std::iter::empty(), &env).unwrap();
    let settings = &config.sinks[0].sandbox.config;
    assert_eq!(settings.0["secret_key"], "TIM_KEY-value");
    assert_eq!(settings.0["region"], "REGION-value-1");
    assert!(!format!("{settings:?}").contains("value"), "Debug must not print values");
}

#[test]
fn environment_variables_override_any_key() {
    let vars = vec![
        ("OUTBOX__OUTBOX_WORKER__BATCH_SIZE".to_string(), "7".to_string()),
        ("OUTBOX__DATABASE__URL".to_string(), "sqlite://other.db".to_string()),
        ("UNRELATED".to_string(), "x".to_string()),
    ];
    let config = Config::from_yaml("outbox_worker:\n  batch_size: 50\n", vars.into_iter(), &|_| None).unwrap();
    assert_eq!(config.worker.batch_size, 7);
    assert_eq!(config.database.url, "sqlite://other.db");

    let vars = vec![("OUTBOX__OUTBOX_WORKER__BATCH_SIZ".to_string(), "7".to_string())];
    let err = Config::from_yaml("", vars.into_iter(), &|_| None).unwrap_err();
    assert!(err.problems[0].starts_with("outbox_worker.batch_siz:"), "{:?}", err.problems);
}

#[test]
fn claim_growth_is_a_whole_factor_that_keeps_claims_within_the_largest_batch() {
    assert_eq!(parse("").unwrap().worker.claim_growth, None, "unset: the backend's default");
    let config = parse("outbox_worker:\n  batch_size: 200\n  claim_growth: 1\n").unwrap();
    assert_eq!(config.worker.claim_growth, Some(1));
    let p = problems("outbox_worker:\n  batch_size: 5000\n  claim_growth: 3\n");
    assert!(
        p.iter().any(|p| p.starts_with("outbox_worker.claim_growth: 3 × batch_size 5000 is more than 10000")),
        "{p:?}"
    );
    for bad in ["0", "-2", "1.5", "lots"] {
        let p = problems(&format!("outbox_worker:\n  claim_growth: {bad}\n"));
        assert!(p.iter().any(|p| p.starts_with("outbox_worker.claim_growth:")), "{bad}: {p:?}");
    }
}

#[test]
fn wrong_types_name_their_key() {
    let p = problems("outbox_worker:\n  enabled: maybe\n  batch_size: lots\n");
    assert!(p.iter().any(|p| p.starts_with("outbox_worker.enabled:")), "{p:?}");
    assert!(p.iter().any(|p| p.starts_with("outbox_worker.batch_size:")), "{p:?}");
}

#[test]
fn sink_limits_and_hosts_are_checked() {
    let p = problems(&format!("{SINK}  memory_limit: 10KiB\n  allowed_hosts: [\"https://x.com\"]\n"));
    assert!(p.iter().any(|p| p.starts_with("sink.memory_limit:")), "{p:?}");
    assert!(p.iter().any(|p| p.starts_with("sink.allowed_hosts:")), "{p:?}");
    let config = parse(&format!("{SINK}  memory_limit: 32MiB\n  cache_dir: \"\"\n")).unwrap();
    let sink = config.sinks[0].clone();
    assert_eq!(sink.sandbox.memory_limit, 32 << 20);
    assert_eq!(sink.sandbox.cache_dir, None);
}

#[test]
fn admin_can_be_turned_off() {
    assert_eq!(parse("admin:\n  listen: \"\"\n").unwrap().admin.listen, None);
}

#[test]
fn passwords_are_redacted() {
    assert_eq!(redact_url("postgres://app:hunter2@db:5432/x"), "postgres://app:***@db:5432/x");
    assert_eq!(redact_url("mysql://root@127.0.0.1/test"), "mysql://***@127.0.0.1/test", "a user alone may be a token");
    assert_eq!(redact_url("sqlite://outbox.db"), "sqlite://outbox.db");
}

#[test]
fn a_table_whose_migrations_table_would_be_too_long_is_refused_per_database() {
    let table = "t".repeat(53);
    let on = |url: &str| format!("database:\n  url: \"{url}\"\noutbox:\n  table: {table}\n");
    let pg = problems(&on("postgres://h/db"));
    assert_eq!(pg.len(), 1, "{pg:?}");
    assert!(pg[0].starts_with("outbox.table:") && pg[0].contains("use at most 52 characters"), "{pg:?}");
    assert!(parse(&on("mysql://h/db")).is_ok(), "MySQL allows 64: 53 + 11 fits");
    assert!(parse(&on("sqlite://x.db")).is_ok());
}

#[test]
fn sink_budgets_and_egress_settings_have_defaults_and_bounds() {
    let sink = parse(SINK).unwrap().sinks[0].clone();
    assert_eq!(sink.sandbox.budgets, SinkBudgets::default());
    assert_eq!(sink.sandbox.budgets.max_retry_after, Duration::from_secs(3600));
    assert!(!sink.sandbox.allow_http, "plain http is opt-in");
    assert_eq!(sink.sandbox.proxy, None);

    let custom = parse(&format!(
        "{SINK}  allow_http: true\n  max_retry_after: 90s\n  max_log_lines: 5\n  max_stdio_bytes: 0\n  proxy: \"http://proxy:3128\"\n"
    ));
    {
        let config = custom.unwrap();
        let sink = &config.sinks[0];
        assert_eq!(sink.sandbox.budgets.max_retry_after, Duration::from_secs(90));
        assert!(sink.sandbox.allow_http);
        assert_eq!(sink.sandbox.budgets.max_log_lines, 5);
        assert_eq!(sink.sandbox.budgets.max_stdio_bytes, 0);
        assert_eq!(sink.sandbox.proxy.as_deref(), Some("http://proxy:3128"));
    }
    let bad =
        problems(&format!("{SINK}  max_log_lines: 0\n  max_requests: -1\n  proxy: \"::\"\n  max_retry_after: 1x\n"));
    for key in ["sink.max_log_lines:", "sink.max_requests:", "sink.proxy:", "sink.max_retry_after:"] {
        assert!(bad.iter().any(|p| p.starts_with(key)), "{key} missing from {bad:?}");
    }
}

/// As the seed does: every duration key reads Go's syntax, and a zero or negative one
/// falls back to its default with a warning rather than failing or busy-looping.
#[test]
fn every_non_positive_duration_falls_back_to_its_default_with_a_note() {
    let keys = [
        ("outbox_worker", "poll_interval"),
        ("outbox_worker", "publish_timeout"),
        ("outbox_worker", "retry_interval"),
        ("outbox_worker", "lease_duration"),
        ("outbox_worker", "shutdown_grace"),
        ("outbox_worker", "probe_interval"),
        ("admin", "stats_interval"),
        ("sink", "max_retry_after"),
    ];
    let defaults = parse(SINK).unwrap();
    for (section, key) in keys {
        for value in ["0", "\"-1m30s\"", "0s"] {
            let yaml = if section == "sink" {
                format!("{SINK}  {key}: {value}\n")
            } else {
                format!("{SINK}{section}:\n  {key}: {value}\n")
            };
            let config = parse(&yaml).unwrap_or_else(|e| panic!("{section}.{key}: {value} refused: {e}"));
            assert!(
                config
                    .notes
                    .iter()
                    .any(|n| n.starts_with(&format!("{section}.{key}: ")) && n.contains("using the default")),
                "{section}.{key}: {value} fell back silently: {:?}",
                config.notes
            );
            assert_eq!(format!("{:?}", config.worker), format!("{:?}", defaults.worker), "{section}.{key}: {value}");
            assert_eq!(config.admin.stats_interval, defaults.admin.stats_interval);
            let sink = config.sinks[0].clone();
            assert_eq!(sink.sandbox.budgets.max_retry_after, defaults.sinks[0].sandbox.budgets.max_retry_after);
        }
    }
}

#[test]
fn the_admin_token_must_be_long_and_is_never_printed() {
    let bad = problems("admin:\n  token: short\n");
    assert!(bad[0].starts_with("admin.token: must be at least 16 characters"), "{bad:?}");
    let config = parse("admin:\n  token: \"0123456789abcdef-secret\"\n  allowed_hosts: [outbox.internal]\n").unwrap();
    assert_eq!(config.admin.token.as_deref(), Some("0123456789abcdef-secret"));
    assert_eq!(config.admin.allowed_hosts, vec!["outbox.internal".to_string()]);
    assert!(!format!("{config:?}").contains("secret"), "the token shows in Debug output");
}

#[test]
fn shutdown_grace_has_a_default_and_falls_back_when_not_positive() {
    assert_eq!(parse("").unwrap().worker.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
    let config = parse("outbox_worker:\n  shutdown_grace: 0s\n").unwrap();
    assert_eq!(config.worker.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
    assert!(config.notes[0].starts_with("outbox_worker.shutdown_grace:"), "{:?}", config.notes);
}

#[test]
fn wake_up_defaults_to_auto_and_notify_needs_postgres() {
    let config = parse("").unwrap();
    assert_eq!((config.worker.wake_up, config.worker.probe_interval), (WakeUp::Auto, Duration::from_millis(20)));
    let pg = parse("database:\n  url: \"postgres://h/db\"\noutbox_worker:\n  wake_up: notify\n").unwrap();
    assert_eq!(pg.worker.wake_up, WakeUp::Notify);
    let bad = problems("outbox_worker:\n  wake_up: notify\n");
    assert!(bad[0].starts_with("outbox_worker.wake_up: notify needs PostgreSQL"), "{bad:?}");
    let bad = problems("outbox_worker:\n  wake_up: telepathy\n");
    assert!(bad[0].contains("is not one of auto, notify, probe, poll"), "{bad:?}");
    let durations = parse("outbox_worker:\n  poll_interval: 1m30s\n  probe_interval: 5ms\n").unwrap();
    assert_eq!(durations.worker.poll_interval, Duration::from_secs(90));
    assert_eq!(durations.worker.probe_interval, Duration::from_millis(5));
}

#[test]
fn the_example_configs_are_valid_and_mean_what_they_say() {
    let example = |name: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        Config::from_yaml(&text, std::iter::empty(), &|var| Some(format!("value-of-{var}")))
            .unwrap_or_else(|e| panic!("{name} is refused: {e}"))
    };
    let demo = example("outbox.yaml");
    assert!(!demo.sinks.is_empty());
    let tencent = example("tencent-im.yaml");
    assert_eq!(tencent.worker.ordering, RoomOrdering::PerRoom);
    assert_eq!(tencent.worker.publish_timeout, Duration::from_secs(5));
    let sink = tencent.sinks[0].clone();
    assert_eq!(sink.sandbox.config.0.get("secret_key").map(String::as_str), Some("value-of-TIM_SECRET_KEY"));
    assert_eq!(tencent.sinks[0].worker.breaker, BreakerSettings::default());
}

#[test]
fn the_breaker_reads_its_thresholds_and_names_bad_ones() {
    let breaker = |extra: &str| parse(&format!("{SINK}  breaker:\n{extra}")).map(|c| c.sinks[0].worker.breaker);
    assert_eq!(
        breaker("    failures: 0\n    cool_down: 250ms\n    max_cool_down: 10s\n").unwrap(),
        BreakerSettings { failures: 0, cool_down: Duration::from_millis(250), max_cool_down: Duration::from_secs(10) }
    );
    let defaults = breaker("    failures: 5\n").unwrap();
    assert_eq!(defaults, BreakerSettings::default());
    let refused =
        breaker("    failures: -1\n    cool_down: 1m\n    max_cool_down: 10s\n    colour: red\n").unwrap_err();
    for key in ["sink.breaker.failures:", "sink.breaker.max_cool_down:", "sink.breaker.colour"] {
        assert!(refused.problems.iter().any(|p| p.starts_with(key)), "{key} not named: {:?}", refused.problems);
    }
}

#[test]
fn several_sinks_each_with_their_own_delivery_settings() {
    let config = parse(
        "outbox_worker:\n  concurrency: 8\n  publish_timeout: 2s\nsinks:\n  - name: tencent-im\n    plugin: im.wasm\n  - name: audit\n    plugin: audit.wasm\n    start_from: beginning\n    concurrency: 2\n    publish_timeout: 10s\n    retry_strategy: exponential\n    max_attempts: 3\n    rate_limit: 50/s\n  - name: activity\n    plugin: activity.wasm\n    start_from: \"2026-11-30T08:00:00Z\"\n",
    )
    .unwrap();
    let names: Vec<&str> = config.sinks.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["tencent-im", "audit", "activity"]);
    let (im, audit, activity) = (&config.sinks[0], &config.sinks[1], &config.sinks[2]);
    assert_eq!(im.start_from, StartFrom::Now);
    assert_eq!((im.worker.concurrency, im.worker.publish_timeout), (8, Duration::from_secs(2)));
    assert_eq!(audit.start_from, StartFrom::Beginning);
    assert_eq!((audit.worker.concurrency, audit.worker.publish_timeout), (2, Duration::from_secs(10)));
    assert_eq!(audit.worker.retry_strategy, RetryStrategy::Exponential);
    assert_eq!(audit.worker.max_attempts, 3);
    assert!(audit.worker.rate_limit.is_some() && im.worker.rate_limit.is_none());
    // The lease is sized for the sink's own settings: 100 events, 2 at a time, 10 s each.
    assert_eq!(audit.worker.lease, WorkerConfig::default_lease(100, 2, Duration::from_secs(10)));
    assert!(audit.worker.lease > im.worker.lease);
    assert_eq!(activity.start_from, StartFrom::At(1_796_025_600_000));
}

#[test]
fn sink_lists_name_every_bad_entry() {
    let p = problems(
        "sinks:\n  - name: b\n    plugin: b.wasm\n  - name: b\n    plugin: c.wasm\n  - name: B\n    plugin: d.wasm\n    start_from: yesterday\n  - plugin: e.wasm\n  - just text\n",
    );
    for expected in [
        "sinks[1].name: \"b\" is used twice",
        "sinks[2].name: \"b\" and \"B\" would share the table room_outbox__b",
        "sinks[2].start_from: \"yesterday\" is not an RFC 3339 time",
        "sinks[3].name: is required",
        "sinks[4]: must be a mapping",
    ] {
        assert!(p.iter().any(|p| p.starts_with(expected)), "{expected} missing from {p:?}");
    }
    let p = problems("sink:\n  name: a\n  plugin: a.wasm\nsinks:\n  - name: b\n    plugin: b.wasm\n");
    assert!(p.iter().any(|p| p.starts_with("sinks: cannot be set together with sink:")), "{p:?}");
    let p = problems(
        "outbox_worker:\n  lease_duration: 40s\nsinks:\n  - name: slow\n    plugin: s.wasm\n    publish_timeout: 30s\n    concurrency: 1\n",
    );
    assert!(
        p.iter().any(|p| p.starts_with("sinks[0].publish_timeout: with concurrency 1 this sink needs a lease")),
        "{p:?}"
    );
    let long = "x".repeat(40);
    let p = problems(&format!(
        "database:\n  url: postgres://h/db\nsinks:\n  - name: first\n    plugin: a.wasm\n  - name: {long}\n    plugin: b.wasm\n"
    ));
    assert!(p.iter().any(|p| p.starts_with("sinks[1].name:") && p.contains("identifier limit")), "{p:?}");
}

/// The keys in the first column of `docs/configuration.md`'s tables: each backquoted name, a
/// bare one (`publish_timeout`) taking the section of the name before it in its cell.
fn documented_keys() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md")).unwrap();
    let mut keys = BTreeSet::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cell = line.split(" | ").next().unwrap_or_default();
        let mut section = String::new();
        for name in cell.split('`').skip(1).step_by(2) {
            let key = if name.contains('.') || section.is_empty() {
                section = name.rsplit_once('.').map_or(String::new(), |(s, _)| format!("{s}."));
                name.to_string()
            } else {
                format!("{section}{name}")
            };
            keys.insert(key);
        }
    }
    keys
}

#[test]
fn the_configuration_doc_names_every_key() {
    // A `sinks[]` entry reads the keys of `sink:`: compared as `sink.` keys. Sections
    // (`admin`, `sink.breaker`) are not keys; `sink.rate_limit` is a key (`200/s`) or a
    // section (`per_room: 10/s`).
    let normal = |keys: BTreeSet<String>| -> BTreeSet<String> {
        keys.into_iter().map(|k| k.replacen("sinks[].", "sink.", 1)).collect()
    };
    let all = normal(known_keys());
    let either = ["sink.rate_limit"];
    let read: BTreeSet<String> = all
        .iter()
        .filter(|k| either.contains(&k.as_str()) || !all.iter().any(|other| other.starts_with(&format!("{k}."))))
        .cloned()
        .collect();
    let documented = normal(documented_keys());
    let missing: Vec<&String> = read.difference(&documented).collect();
    assert!(missing.is_empty(), "keys the parser reads that docs/configuration.md does not list: {missing:?}");
    let unknown: Vec<&String> = documented.difference(&read).collect();
    assert!(unknown.is_empty(), "keys docs/configuration.md lists that the parser does not read: {unknown:?}");
    assert!(read.len() > 50, "only {} keys read: the recording missed some", read.len());
}

#[test]
fn the_readmes_fifteen_line_config_is_accepted() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let section = &readme[readme.find("## Configuration in fifteen lines").expect("the README's config example")..];
    let yaml = section.split("```yaml\n").nth(1).and_then(|b| b.split("```").next()).unwrap();
    assert!(yaml.lines().count() <= 15, "the README's example is longer than fifteen lines");
    let env = |name: &str| (name == "TIM_SECRET_KEY").then(|| "secret".to_string());
    let config = Config::from_yaml(yaml, std::iter::empty(), &env).unwrap();
    assert_eq!(config.require_sinks("run").unwrap()[0].name(), "tencent-im");
    assert_eq!(config.worker.concurrency, 16);
}

#[test]
fn brokers_are_checked_and_a_relay_names_one_that_exists() {
    let yaml = "sink:\n  name: to-nats\n  plugin: relay.wasm\n  broker: missing\n\
                brokers:\n  events:\n    kind: pulsar\n    stream: ROOMS\n    create_stream: true\n    user: u\n";
    let problems = problems(yaml);
    for expected in [
        "brokers.events.kind: \"pulsar\" is not one of nats, redis, rabbitmq, mqtt, kafka",
        "brokers.events.url: is required",
        "brokers.events.subjects: is required with create_stream: true",
        "brokers.events.user: and password go together",
        "brokers: has no broker \"missing\", which sink to-nats names",
    ] {
        assert!(problems.iter().any(|p| p.starts_with(expected)), "no {expected:?} in {problems:?}");
    }
    let fine = "sink:\n  name: to-nats\n  plugin: relay.wasm\n  broker: events\n\
                brokers:\n  events:\n    kind: nats\n    url: nats://127.0.0.1:4222\n    stream: ROOMS\n    token: ${NATS_TOKEN}\n";
    let config =
        Config::from_yaml(fine, std::iter::empty(), &|v| (v == "NATS_TOKEN").then(|| "t0ken".to_string())).unwrap();
    assert_eq!(config.sinks[0].broker.as_deref(), Some("events"));
    assert_eq!(config.brokers[0].token.as_deref(), Some("t0ken"));
    assert!(!format!("{:?}", config.brokers[0]).contains("t0ken"), "the token is never printed");
}

#[test]
fn a_brokers_keys_are_those_of_its_kind() {
    let yaml = "sink: {name: to-redis, plugin: relay.wasm, broker: events}\n\
                brokers:\n  events: {kind: redis, url: \"nats://127.0.0.1:4222\", stream: ROOMS, \
                dedup_window: 10ms, max_len: 0, exchange: rooms}\n";
    let problems = problems(yaml);
    for expected in [
        "brokers.events.url: is required: redis://host:port",
        "brokers.events.stream: is a key of kind nats brokers, not redis",
        "brokers.events.exchange: is a key of kind rabbitmq brokers, not redis",
        "brokers.events.dedup_window: \"10ms\" is shorter than a second",
        "brokers.events.max_len: 0 is not a positive number of entries",
    ] {
        assert!(problems.iter().any(|p| p.starts_with(expected)), "no {expected:?} in {problems:?}");
    }
    let fine = "sink: {name: to-redis, plugin: relay.wasm, broker: events}\n\
                brokers:\n  events: {kind: redis, url: \"redis://127.0.0.1:6379/0\", dedup_window: 1h, max_len: 100000, \
                allowed_destinations: [\"rooms:*\"]}\n\
                \x20 queue: {kind: rabbitmq, url: \"amqp://127.0.0.1:5672/%2f\", exchange: rooms, user: guest, password: guest}\n";
    let config = parse(fine).unwrap();
    let redis = config.brokers.iter().find(|b| b.name == "events").unwrap();
    assert_eq!((redis.dedup_window, redis.max_len), (std::time::Duration::from_secs(3600), Some(100_000)));
    let rabbit = config.brokers.iter().find(|b| b.name == "queue").unwrap();
    assert_eq!((rabbit.exchange.as_str(), rabbit.user.as_deref()), ("rooms", Some("guest")));
}

#[test]
fn a_kafka_broker_takes_bootstrap_servers_a_topic_and_its_security_settings() {
    let yaml = "sink: {name: to-kafka, plugin: relay.wasm, broker: events}\n\
                brokers:\n  events: {kind: kafka, url: \"kafka://127.0.0.1:9092\", bootstrap: [\"127.0.0.1\", \"a@b:9092\"], \
                topic: \"__consumer_offsets\", partitions: 0, ca_file: /nowhere.pem, sasl_mechanism: GSSAPI, exchange: x}\n\
                \x20 other: {kind: kafka, topic: \"rooms events\", sasl_mechanism: PLAIN}\n\
                \x20 nats: {kind: nats, url: \"nats://127.0.0.1:4222\", stream: S, topic: rooms, bootstrap: [\"h:1\"]}\n";
    let problems = problems(yaml);
    for expected in [
        "brokers.events.url: is not a key of kafka brokers: they take bootstrap: [\"host:port\", …]",
        "brokers.events.bootstrap: \"127.0.0.1\" is not host:port",
        "brokers.events.bootstrap: \"a@b:9092\" is not host:port",
        "brokers.events.topic: names one of the cluster's own topics",
        "brokers.events.partitions: 0 is not between 1 and 10000",
        "brokers.events.ca_file: is for tls: true",
        "brokers.events.sasl_mechanism: \"GSSAPI\" is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
        "brokers.events.exchange: is a key of kind rabbitmq brokers, not kafka",
        "brokers.other.bootstrap: is required: a list of the cluster's host:port",
        "brokers.other.topic: is required: the topic records go to by default (is not a topic name: letters, digits",
        "brokers.other.sasl_mechanism: is for user and password, which are not set",
        "brokers.nats.topic: is a key of kind kafka brokers, not nats",
        "brokers.nats.bootstrap: is a key of kind kafka brokers, not nats",
    ] {
        assert!(problems.iter().any(|p| p.starts_with(expected)), "no {expected:?} in {problems:?}");
    }
    let fine = "sink: {name: to-kafka, plugin: relay.wasm, broker: events}\n\
                brokers:\n  events: {kind: kafka, bootstrap: [\"k1.example:9092\", \"10.0.0.2:9093\"], topic: room-events, \
                create_topic: true, partitions: 12, tls: true, user: relay, password: \"${KAFKA_PASSWORD}\", \
                sasl_mechanism: SCRAM-SHA-512}\n";
    let env = |v: &str| (v == "KAFKA_PASSWORD").then(|| "s3cret-pw".to_string());
    let config = Config::from_yaml(fine, std::iter::empty(), &env).unwrap();
    let kafka = &config.brokers[0];
    assert_eq!(kafka.url, "kafka://k1.example:9092,10.0.0.2:9093");
    assert_eq!((kafka.topic.as_str(), kafka.create_topic, kafka.partitions), ("room-events", true, 12));
    assert_eq!((kafka.tls, kafka.sasl_mechanism.as_str()), (true, "SCRAM-SHA-512"));
    assert!(kafka.allowed_destinations.is_empty(), "the default: the topic");
    assert!(config.credentials().contains(&"s3cret-pw".to_string()), "the password is redacted from output");
    assert!(!format!("{kafka:?}").contains("s3cret-pw"), "the password is never printed");
}

#[test]
fn allowed_destinations_are_required_where_a_kind_has_no_default_and_never_reach_the_control_plane() {
    let yaml = "sink: {name: relay, plugin: relay.wasm, broker: r}\n\
                brokers:\n  r: {kind: redis, url: \"redis://127.0.0.1:6379/0\"}\n\
                \x20 m: {kind: mqtt, url: \"mqtt://127.0.0.1:1883\", allowed_destinations: [\"a/#/b\", \"$SYS/#\"]}\n\
                \x20 q: {kind: rabbitmq, url: \"amqp://127.0.0.1:5672/%2f\"}\n\
                \x20 n: {kind: nats, url: \"nats://127.0.0.1:4222\", stream: S, allowed_destinations: [\"$JS.API.>\"]}\n\
                \x20 e: {kind: nats, url: \"nats://127.0.0.1:4222\", stream: S, allowed_destinations: []}\n";
    let problems = problems(yaml);
    for expected in [
        "brokers.r.allowed_destinations: is required for a redis broker",
        "brokers.m.allowed_destinations: \"a/#/b\": # comes last",
        "brokers.m.allowed_destinations: \"$SYS/#\" reaches the broker's control plane",
        "brokers.q.allowed_destinations: is required for a rabbitmq broker: the queues relays may publish to through the default exchange",
        "brokers.n.allowed_destinations: \"$JS.API.>\" reaches the broker's control plane",
        "brokers.e.allowed_destinations: is empty",
    ] {
        assert!(problems.iter().any(|p| p.starts_with(expected)), "no {expected:?} in {problems:?}");
    }
    let fine = "sink: {name: relay, plugin: relay.wasm, broker: n}\n\
                brokers:\n  n: {kind: nats, url: \"nats://127.0.0.1:4222\", stream: S}\n\
                \x20 q: {kind: rabbitmq, url: \"amqp://127.0.0.1:5672/%2f\", exchange: rooms}\n";
    let config = parse(fine).unwrap();
    assert!(config.brokers.iter().all(|b| b.allowed_destinations.is_empty()), "the kinds' defaults");
}

#[test]
fn the_relay_docs_config_is_accepted() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/relay.md")).unwrap();
    let yaml = doc.split("```yaml\n").nth(1).and_then(|b| b.split("```").next()).unwrap();
    let config = parse(yaml).unwrap();
    assert_eq!(config.sinks[0].broker.as_deref(), Some("events"));
    assert_eq!((config.brokers[0].stream.as_str(), config.brokers[0].create_stream), ("ROOMS", true));
    // The other kinds' example, with a relay naming each broker in turn.
    let kinds = doc.split("```yaml\n").nth(2).and_then(|b| b.split("```").next()).unwrap();
    for broker in ["streams", "queues", "devices", "log"] {
        let yaml = format!("{kinds}sink:\n  name: relay\n  plugin: relay.wasm\n  broker: {broker}\n");
        let env = |v: &str| (v == "AMQP_PASSWORD").then(|| "secret".to_string());
        let config = Config::from_yaml(&yaml, std::iter::empty(), &env).unwrap();
        assert_eq!(config.brokers.len(), 4);
    }
}
