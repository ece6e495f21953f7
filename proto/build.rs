//! Compiles `room_events.proto` with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=room_events.proto");
    let descriptors = protox::compile(["room_events.proto"], ["."])?;
    prost_build::Config::new()
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .type_attribute(".", "#[serde(default, deny_unknown_fields)]")
        .compile_fds(descriptors)?;
    Ok(())
}
