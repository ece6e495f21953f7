//! The release shape: `--version`, and the `make dist` tarball unpacked into an empty
//! directory, running the host from it on SQLite.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use outbox_host::sandbox::contract::VERSION;

use crate::binary::BIN;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[test]
fn version_names_the_release_the_git_revision_and_the_sink_contract() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let head = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(repo()).output().unwrap();
    let rev = String::from_utf8(head.stdout).unwrap().trim().to_string();
    let expected = format!(
        "outbox-host {}\ngit revision: {rev}\nsink contract: outbox:sink@{}.{}.0 to {VERSION} (wit/sink.wit; a sink built for any of them loads)\n",
        env!("CARGO_PKG_VERSION"),
        VERSION.major,
        VERSION.minor
    );
    assert_eq!(text, expected);
}

/// Runs `outbox-host` from the unpacked tarball in `dir`, with `args`.
fn unpacked(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(dir.join("bin/outbox-host"));
    command.args(args).current_dir(dir).env_remove("OUTBOX_CONFIG").env("XDG_CACHE_HOME", dir.join("cache"));
    command
}

#[tokio::test]
async fn the_dist_tarball_runs_the_host_on_sqlite_from_an_empty_directory() {
    // The script `make dist` runs, on the debug build the tests already have.
    let out_dir = tempfile::tempdir().unwrap();
    let target_dir = Path::new(BIN).parent().and_then(Path::parent).unwrap();
    let plugins = Path::new(outbox_test_support::FAKE_SINK).parent().unwrap();
    let packed = Command::new(repo().join("scripts/dist.sh"))
        .env("PROFILE", "debug")
        .env("CARGO_TARGET_DIR", target_dir)
        .env("PLUGINS", plugins)
        .env("DIST_DIR", out_dir.path())
        .output()
        .unwrap();
    assert!(packed.status.success(), "{}", String::from_utf8_lossy(&packed.stderr));
    let tarball = PathBuf::from(String::from_utf8(packed.stdout).unwrap().trim());
    let name = tarball.file_name().unwrap().to_str().unwrap().trim_end_matches(".tar.gz").to_string();
    assert!(name.starts_with(&format!("outbox-host-{}-", env!("CARGO_PKG_VERSION"))), "{name}");

    let empty = tempfile::tempdir().unwrap();
    let unpack = Command::new("tar").arg("-xzf").arg(&tarball).current_dir(empty.path()).status().unwrap();
    assert!(unpack.success());
    let dir = empty.path().join(&name);
    for file in [
        "bin/outbox-host",
        "sinks/fake_sink.wasm",
        "sinks/tencent_im_sink.wasm",
        "sinks/webhook_sink.wasm",
        "sinks/relay.wasm",
        "outbox.yaml",
        "README.md",
        "CHANGELOG.md",
        "docs/configuration.md",
        "wit/sink.wit",
        "deploy/prometheus/alerts.yml",
    ] {
        assert!(dir.join(file).is_file(), "the tarball has no {file}");
    }
    let unit = std::fs::read_to_string(dir.join("deploy/systemd/outbox-host.service")).unwrap();
    for directive in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "StateDirectory=outbox-host",
        "WorkingDirectory=%S/outbox-host",
        "CacheDirectory=outbox-host",
        "Environment=XDG_CACHE_HOME=%C",
        "ExecStart=/opt/outbox-host/bin/outbox-host --config /etc/outbox-host/outbox.yaml",
    ] {
        assert!(unit.lines().any(|l| l.starts_with(directive)), "the unit has no {directive}");
    }
    assert!(!unit.lines().any(|l| l.starts_with("MemoryDenyWriteExecute")), "wasmtime needs executable memory");

    // From the unpacked directory alone: enqueue, run until delivered, stop.
    let enqueued = unpacked(
        &dir,
        &[
            "-c",
            "outbox.yaml",
            "enqueue",
            "-t",
            "RoomUserJoined",
            "-r",
            "room-1",
            "-b",
            r#"{"user_id":"u-1"}"#,
            "-n",
            "3",
        ],
    )
    .output()
    .unwrap();
    assert!(enqueued.status.success(), "{}", String::from_utf8_lossy(&enqueued.stderr));
    let host = unpacked(&dir, &["-c", "outbox.yaml", "--json-logs", "run"])
        .env("OUTBOX__ADMIN__LISTEN", "")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(crate::binary::HostProcess::new)
        .unwrap();
    let deadline = std::time::Instant::now() + crate::support::PATIENCE;
    loop {
        let status = unpacked(&dir, &["-c", "outbox.yaml", "status"]).output().unwrap();
        let text = String::from_utf8_lossy(&status.stdout).to_string();
        if text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["delivered", "3"]) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the events were not delivered:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    }
    crate::binary::signal(&host, "TERM");
    let output = crate::binary::wait_exit_within(host, Duration::from_secs(30)).await;
    assert!(output.status.success(), "the host did not stop cleanly: {}", String::from_utf8_lossy(&output.stderr));
    let logs = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    assert_eq!(logs.matches("event delivered").count(), 3, "{logs}");
    assert!(dir.join("outbox.db").is_file(), "the SQLite file is in the directory it ran from");
}
