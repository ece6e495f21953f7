//! The sink author's tools on the real binary: `try-sink` on the fake, webhook and Tencent IM
//! sinks, live against stand-ins and as dry runs; `new-sink`'s crate built for
//! wasm32-wasip2, loaded by the host and delivering; and the walkthrough of docs/sinks.md, command by
//! command.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use outbox_host::store::Status;
use outbox_test_support::tencent::{IDENTIFIER, SDK_APP_ID, SECRET_KEY, Script, TencentIm};
use outbox_test_support::webhook::{Receiver, SECRET};
use outbox_test_support::{FAKE_SINK, RELAY, TENCENT_IM_SINK, WEBHOOK_SINK};

use crate::binary::BIN;
use crate::support::{Running, SinkSpec, World};

/// `outbox-host try-sink <args>`: exit code, stdout, stderr.
async fn try_sink(args: &[String]) -> (i32, String, String) {
    let args = args.to_vec();
    let out = tokio::task::spawn_blocking(move || {
        // No config file: a sink author's directory has none.
        let dir = tempfile::tempdir().unwrap();
        Command::new(BIN).current_dir(dir.path()).arg("try-sink").args(&args).stdin(Stdio::null()).output()
    })
    .await
    .unwrap()
    .expect("running outbox-host try-sink");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| a.to_string()).collect()
}

/// `try-sink` on a relay shows the records it makes of the event (publishing nothing: it
/// has no broker); the relay's config problems refuse it, as a sink's do.
#[tokio::test]
async fn try_sink_shows_a_relays_records() {
    let base = ["--plugin", RELAY, "-t", "RoomGiftSent", "-r", "room-1", "-b", r#"{"gift_id":"rose","gift_count":2}"#];
    let routed = [&base[..], &["--set", "destination=rooms.{room_id}"]].concat();
    let (code, stdout, stderr) = try_sink(&args(&routed)).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.starts_with("record   1 of 1: rooms.room-1 (key room-1)\n"), "{stdout}");
    assert!(stdout.contains("         outbox-room-id: room-1\n"), "{stdout}");
    assert!(stdout.contains(r#""gift_id":"rose""#), "the JSON payload: {stdout}");
    assert!(stdout.ends_with("(try-sink publishes nothing)\n"), "{stdout}");

    let other_type = [&routed[..], &["--set", "types=RoomHeatChanged"]].concat();
    let (code, stdout, _) = try_sink(&args(&other_type)).await;
    assert_eq!((code, stdout.as_str()), (0, "outcome  skipped: not for this relay\n"));

    let (code, _, stderr) = try_sink(&args(&[&base[..], &["--set", "format=yaml"]].concat())).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("sink.config.destination: required"), "{stderr}");
    assert!(stderr.contains("format: \"yaml\" is not json or protobuf"), "{stderr}");
}

#[tokio::test]
async fn try_sink_runs_the_fake_sink_live_and_dry() {
    let world = World::new().await;
    let ok = world.collector.url("/ok");
    let allow = world.collector.host_port();
    let base = ["--plugin", FAKE_SINK, "--allow-host", &allow, "--allow-http", "-t", "RoomGiftSent", "-r", "room-1"];
    let body = ["-b", r#"{"gift_id":"rose","gift_count":2}"#];

    let behaviour = format!("default=http:{ok}");
    let live = [&base[..], &body, &["--set", &behaviour]].concat();
    let (code, stdout, stderr) = try_sink(&args(&live)).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains(&format!("request  GET {ok}\n")), "{stdout}");
    assert!(stdout.contains("reply    200\n") && stdout.ends_with("outcome  delivered\n"), "{stdout}");
    assert_eq!(world.collector.seen().len(), 1, "the live request reached the server");

    let dry = [&live[..], &["--dry-run", "--reply", "503"]].concat();
    let (code, stdout, _) = try_sink(&args(&dry)).await;
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("reply    503 (scripted: --dry-run)"), "{stdout}");
    assert!(stdout.ends_with("outcome  retryable: http: status 503\n"), "{stdout}");
    assert_eq!(world.collector.seen().len(), 1, "a dry run sends nothing");

    // A dry run still applies the egress rules.
    let denied = [&base[..], &["--set", "default=http:http://127.0.0.1:9/x", "--dry-run"]].concat();
    let (code, stdout, _) = try_sink(&args(&denied)).await;
    assert_eq!(code, 1);
    assert!(stdout.contains("reply    none: denied: 127.0.0.1:9 is not in this sink's allowed_hosts"), "{stdout}");

    // Log lines, in order with the outcome.
    let logged = [&base[..], &["--set", "default=log"]].concat();
    let (_, stdout, _) = try_sink(&args(&logged)).await;
    assert_eq!(stdout, "log      info: fake sink got RoomGiftSent for room room-1\noutcome  delivered\n");

    // Past the log budget, the rest is dropped and said so.
    let flood = [&base[..], &["--set", "default=log-flood:150"]].concat();
    let (_, stdout, _) = try_sink(&args(&flood)).await;
    assert_eq!(stdout.lines().filter(|l| l.starts_with("log      info: flood line ")).count(), 100, "{stdout}");
    assert!(stdout.contains("log      warn (host): 50 further lines were dropped (sink.max_log_lines"), "{stdout}");

    // A config the sink refuses: exit 2, every problem named.
    let refused = [&base[..], &["--set", "default=bogus"]].concat();
    let (code, _, stderr) = try_sink(&args(&refused)).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("sink.config.default: unknown behaviour \"bogus\" (reported by the sink)"), "{stderr}");

    // A careless sink logs and posts a secret of its config: shown as *** wherever it is.
    let collector = format!("collector={}", world.collector.url("/report"));
    let leaky = [
        &base[..],
        &["--set", "default=leak:api_token", "--set", "api_token=s3cr3t-value-123", "--set", &collector, "--dry-run"],
    ]
    .concat();
    let (code, stdout, _) = try_sink(&args(&leaky)).await;
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("log      info: config api_token is ***\n"), "{stdout}");
    assert!(stdout.contains("body: api_token=***\n"), "{stdout}");
    assert!(!stdout.contains("s3cr3t"), "a secret was printed: {stdout}");
}

#[tokio::test]
async fn try_sink_runs_the_webhook_sink_live_and_dry() {
    let receiver = Receiver::start([]).await;
    let url = receiver.url("events");
    let base = [
        "--plugin",
        WEBHOOK_SINK,
        "--set",
        &format!("url={url}"),
        "--set",
        &format!("secret={SECRET}"),
        "--set",
        "headers=Authorization: Bearer t0k3n",
        "--allow-host",
        &receiver.host_port(),
        "--allow-http",
        "-t",
        "RoomHeatChanged",
        "-r",
        "room-9",
        "-b",
        r#"{"heat":1200}"#,
    ];
    let (code, stdout, stderr) = try_sink(&args(&base)).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    let received = receiver.received();
    assert_eq!(received.len(), 1);
    assert!(received[0].problems.is_empty(), "{:?}", received[0].problems);
    assert_eq!(received[0].body["data"]["body"]["heat"], 1200);
    assert!(stdout.contains(&format!("request  POST {url}\n")), "{stdout}");
    assert!(stdout.contains(&format!("         webhook-id: {}\n", received[0].id)), "{stdout}");
    assert!(stdout.contains("         Authorization: ***\n") && !stdout.contains("t0k3n"), "{stdout}");
    assert!(stdout.contains(r#"body: {"data":{"#) && stdout.contains("reply    204\n"), "{stdout}");
    assert!(!stdout.contains("MfKQ9r8G") && !stderr.contains("MfKQ9r8G"), "the secret was shown");

    let dry = [&base[..], &["--dry-run", "--reply", "429", "--reply-header", "Retry-After: 5"]].concat();
    let (code, stdout, _) = try_sink(&args(&dry)).await;
    assert_eq!(code, 1);
    assert!(stdout.contains("reply    429 (scripted: --dry-run)\n         retry-after: 5\n"), "{stdout}");
    assert!(
        stdout.ends_with("outcome  retryable: HTTP 429 from webhook (retry after 5s; pushes back: throttled)\n"),
        "{stdout}"
    );
    assert_eq!(receiver.received().len(), 1, "a dry run sends nothing");

    let at = base.iter().position(|a| a.starts_with("secret=")).unwrap();
    let no_secret = [&base[..at - 1], &base[at + 1..]].concat();
    let (code, _, stderr) = try_sink(&args(&no_secret)).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("sink.config.secret: is required"), "{stderr}");
}

#[tokio::test]
async fn try_sink_runs_the_tencent_im_sink_live_and_dry() {
    let im = TencentIm::start([("live_room-1".to_string(), Script::Ok)]).await;
    let base = [
        "--plugin".to_string(),
        TENCENT_IM_SINK.to_string(),
        "--set".into(),
        format!("sdk_app_id={SDK_APP_ID}"),
        "--set".into(),
        format!("identifier={IDENTIFIER}"),
        "--set".into(),
        format!("secret_key={SECRET_KEY}"),
        "--set".into(),
        format!("endpoint={}", im.endpoint()),
        "--set".into(),
        "group_id_prefix=live_".into(),
        "--allow-host".into(),
        im.host_port(),
        "--allow-http".into(),
        "-t".into(),
        "RoomGiftSent".into(),
        "-r".into(),
        "room-1".into(),
        "-b".into(),
        r#"{"gift_id":"rose","gift_count":1}"#.into(),
    ];
    let (code, stdout, stderr) = try_sink(&base).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    let received = im.received();
    assert_eq!(received.len(), 1);
    assert!(received[0].problems.is_empty(), "{:?}", received[0].problems);
    assert!(stdout.contains("&usersig=***&"), "the UserSig is redacted: {stdout}");
    assert!(!stdout.contains(&received[0].query["usersig"]) && !stdout.contains(SECRET_KEY), "{stdout}");
    assert!(stdout.contains(r#""ErrorCode":0"#) && stdout.ends_with("outcome  delivered\n"), "{stdout}");

    let reply = r#"{"ActionStatus":"FAIL","ErrorCode":10010,"ErrorInfo":"group dissolved"}"#;
    let dry = [&base[..], &args(&["--dry-run", "--reply-body", reply])].concat();
    let (code, stdout, _) = try_sink(&dry).await;
    assert_eq!(code, 1);
    assert!(stdout.ends_with("outcome  permanent: Tencent IM error 10010: group dissolved\n"), "{stdout}");
    assert_eq!(im.received().len(), 1, "a dry run sends nothing");
}

/// The shared target directory of `plugins/` (see tests/build.rs): building a new sink there
/// with `plugins/Cargo.lock`'s versions reuses their compiled dependencies.
fn wasm_target_dir() -> PathBuf {
    Path::new(FAKE_SINK).ancestors().nth(3).unwrap().to_path_buf()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `cargo <args>` in `dir` as a sink author runs it: the crate's own `target/`, none of this
/// test run's cargo settings.
fn cargo(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(dir)
        .args(args)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .expect("running cargo");
    assert!(out.status.success(), "cargo {args:?} in {}:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr));
    out
}

/// Points the new crate at the shared build: the same dependency versions, and its
/// `target/` a link to the shared target directory.
fn share_build(dir: &Path) {
    std::fs::copy(repo().join("plugins/Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    std::os::unix::fs::symlink(wasm_target_dir(), dir.join("target")).unwrap();
}

#[tokio::test]
async fn a_scaffolded_sink_builds_tests_loads_and_delivers() {
    let world = World::new().await;
    let dir = world.dir.path().join("hook-sink");
    let out = Command::new(BIN).args(["new-sink", "hook-sink", "--dir"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for file in ["Cargo.toml", "src/lib.rs", "README.md", ".gitignore"] {
        assert!(dir.join(file).exists(), "{file} was not written");
    }
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("name = \"hook-sink\"") && manifest.contains("package = \"outbox:hook-sink\""));
    assert!(manifest.contains("crate-type = [\"cdylib\", \"rlib\"]"), "{manifest}");
    // Refuses to write over a crate.
    let again = Command::new(BIN).args(["new-sink", "hook-sink", "--dir"]).arg(&dir).output().unwrap();
    assert_eq!(again.status.code(), Some(2));

    share_build(&dir);
    let dir2 = dir.clone();
    let tested = tokio::task::spawn_blocking(move || cargo(&dir2, &["test"])).await.unwrap();
    assert!(String::from_utf8_lossy(&tested.stdout).contains("test result: ok. 1 passed"));
    let dir2 = dir.clone();
    tokio::task::spawn_blocking(move || cargo(&dir2, &["build", "--release", "--target", "wasm32-wasip2"]))
        .await
        .unwrap();
    let plugin = dir.join("target/wasm32-wasip2/release/hook_sink.wasm");
    let plugin: &'static str = Box::leak(plugin.display().to_string().into_boxed_str());

    // The real host, on a database, delivering through it to a verifying-nothing endpoint.
    let spec = SinkSpec {
        name: "hook",
        plugin,
        allowed_hosts: vec![world.collector.host_port()],
        config: format!("url: \"{}\"\nskip: RoomCreated", world.collector.url("/ok")),
    };
    let delivered = world.produce("RoomHeatChanged", "room-1", Status::Pending).await;
    let skipped = world.produce("RoomCreated", "room-1", Status::Pending).await;
    let mut host = Running::start(world.config_with("", &spec)).await;
    host.wait_status(&world, &[&delivered, &skipped], Status::Delivered).await;
    host.stop().await;
    let seen = world.collector.seen();
    assert_eq!(seen.len(), 1, "only the event not in skip was sent");
    let key = seen[0].headers.iter().find(|(k, _)| k == "idempotency-key").map(|(_, v)| v.as_str());
    assert_eq!(key, Some(delivered.as_str()));
}

/// One step of the walkthrough in docs/sinks.md.
enum Step {
    /// A shell command.
    Run(String),
    /// A YAML block: the config file of the directory the walkthrough is in.
    Config(String),
}

/// The "Walkthrough" section of docs/sinks.md: its `sh` commands (continuations joined, comments
/// dropped) and its YAML, in order; its `text` block (try-sink's output); its `rust` block.
fn walkthrough() -> (Vec<Step>, String, String) {
    let doc = std::fs::read_to_string(repo().join("docs/sinks.md")).unwrap();
    let start = doc.find("## Walkthrough").expect("docs/sinks.md has a walkthrough");
    let section = &doc[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |end| end + 3)];
    let (mut steps, mut text, mut rust) = (Vec::new(), String::new(), String::new());
    for block in section.split("```").skip(1).step_by(2) {
        let (lang, body) = block.split_once('\n').unwrap();
        match lang {
            "sh" => {
                let joined = body.replace("\\\n", " ");
                for line in joined.lines() {
                    let command = line.split("  #").next().unwrap().trim();
                    if !command.is_empty() {
                        steps.push(Step::Run(command.to_string()));
                    }
                }
            }
            "yaml" => steps.push(Step::Config(body.to_string())),
            "text" => text = body.to_string(),
            "rust" => rust = body.to_string(),
            other => panic!("a {other:?} block in the walkthrough"),
        }
    }
    (steps, text, rust)
}

#[tokio::test]
async fn the_sinks_doc_walkthrough_runs() {
    let (steps, shown_output, shown_sink) = walkthrough();
    let template = std::fs::read_to_string(repo().join("plugins/template/src/lib.rs")).unwrap();
    let sink_only = &template[..template.find("#[cfg(test)]").unwrap()];
    assert_eq!(shown_sink.trim_end(), sink_only.trim_end(), "docs/sinks.md shows another sink than the template's");

    let world = World::new().await;
    let bin = world.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(BIN, bin.join("outbox-host")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cwd = world.dir.path().to_path_buf();
    let mut shared = false;
    let mut ran = Vec::new();
    for step in steps {
        let command = match step {
            Step::Config(yaml) => {
                // The walkthrough's port is the test's server.
                let yaml = yaml.replace("127.0.0.1:8080", &world.collector.host_port());
                std::fs::write(cwd.join("outbox.yaml"), yaml).unwrap();
                ran.push("(config)".to_string());
                continue;
            }
            Step::Run(command) => command,
        };
        ran.push(command.clone());
        if let Some(dir) = command.strip_prefix("cd ") {
            cwd = cwd.join(dir);
            continue;
        }
        if command.starts_with("cargo ") && !shared {
            share_build(&cwd);
            shared = true;
        }
        let mut shell = Command::new("bash");
        shell
            .arg("-c")
            .arg(&command)
            .current_dir(&cwd)
            .env("PATH", &path)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .env_remove("OUTBOX_CONFIG")
            .stdin(Stdio::null());
        if command == "outbox-host run" {
            let child = shell
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map(crate::binary::HostProcess::new)
                .unwrap();
            wait_until("the event reached the walkthrough's endpoint", || {
                world
                    .collector
                    .seen()
                    .iter()
                    .any(|s| s.path == "/events" && s.json.as_ref().is_some_and(|j| j["body"]["heat"] == 1200))
            })
            .await;
            crate::binary::signal(&child, "TERM");
            let out = crate::binary::wait_exit(child).await;
            assert!(out.status.success(), "outbox-host run: {}", String::from_utf8_lossy(&out.stderr));
            continue;
        }
        let out = tokio::task::spawn_blocking(move || shell.output()).await.unwrap().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{command}:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
        if command.starts_with("outbox-host try-sink") {
            // Line for line, event ids aside; a walkthrough line cut with `…` matches what starts so.
            let got: Vec<String> = stdout.lines().map(without_ids).collect();
            let shown: Vec<String> = shown_output.lines().map(without_ids).collect();
            assert_eq!(shown.len(), got.len(), "try-sink printed other lines than docs/sinks.md shows:\n{stdout}");
            for (shown, got) in shown.iter().zip(&got) {
                let same = match shown.split_once('…') {
                    Some((start, _)) => got.starts_with(start),
                    None => got == shown,
                };
                assert!(same, "docs/sinks.md shows {shown:?} where try-sink printed {got:?}");
            }
        }
    }
    let expected =
        ["outbox-host new-sink my-sink", "cd my-sink", "cargo test", "cargo build --release --target wasm32-wasip2"];
    assert_eq!(ran[..4], expected, "the walkthrough's steps changed: {ran:?}");
    assert!(ran.iter().any(|c| c.starts_with("outbox-host try-sink")), "{ran:?}");
    assert_eq!(
        ran[ran.len() - 4..],
        [
            "(config)",
            "outbox-host check-config",
            "outbox-host enqueue -t RoomHeatChanged -r room-1 -b '{\"heat\":1200}'",
            "outbox-host run"
        ]
    );
}

/// `line` with the digits after `try-` (an event id made of the time) taken out.
fn without_ids(line: &str) -> String {
    match line.split_once("try-") {
        Some((before, after)) => format!("{before}try-{}", after.trim_start_matches(|c: char| c.is_ascii_digit())),
        None => line.to_string(),
    }
}

async fn wait_until(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + crate::support::PATIENCE;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "waited {:?} for {what}", crate::support::PATIENCE);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
