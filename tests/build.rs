//! Builds the sink plugins in `plugins/` for wasm32-wasip2 with their own target directory
//! beside this build's, and writes their paths as constants for the tests.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out.
    let target_dir = out_dir.ancestors().nth(4).unwrap().join("wasm-plugins");
    // Relative to this package, so that two checkouts sharing a target directory each
    // watch their own files.
    for watched in [
        "plugins/Cargo.toml",
        "plugins/fake",
        "plugins/sdk",
        "plugins/webhook",
        "plugins/sink-0-1-0",
        "plugins/sink-0-2-0",
        "plugins/tencent-im",
        "plugins/relay",
        "wit",
        "proto",
    ] {
        println!("cargo:rerun-if-changed=../{watched}");
    }

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path", "plugins/Cargo.toml"])
        .env("CARGO_TARGET_DIR", &target_dir)
        // Flags meant for the host build must not leak into the wasm build.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .status()
        .expect("running cargo to build the sink plugins");
    assert!(
        status.success(),
        "building plugins/ for wasm32-wasip2 failed (is the wasm32-wasip2 target installed? rustup target add wasm32-wasip2)"
    );

    let built = target_dir.join("wasm32-wasip2/release");
    let mut consts = String::new();
    for (name, file) in [
        ("FAKE_SINK", "fake_sink.wasm"),
        ("TENCENT_IM_SINK", "tencent_im_sink.wasm"),
        ("WEBHOOK_SINK", "webhook_sink.wasm"),
        ("SINK_0_1_0", "sink_0_1_0.wasm"),
        ("SINK_0_2_0", "sink_0_2_0.wasm"),
        ("RELAY", "relay.wasm"),
    ] {
        let path = built.join(file);
        assert!(Path::new(&path).exists(), "{} was not built", path.display());
        consts.push_str(&format!(
            "/// Path of the built `{file}`.\npub const {name}: &str = {:?};\n",
            path.display().to_string()
        ));
    }
    std::fs::write(out_dir.join("plugins.rs"), consts).unwrap();
}
