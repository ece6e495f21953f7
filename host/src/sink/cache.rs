//! Compiled components cached on disk, so a restart does not recompile the sink.
//!
//! The cache key covers the component's bytes and the engine's compatibility hash (wasmtime
//! version and every setting that changes code generation), so a stale artifact is never
//! loaded; a corrupt one is recompiled and replaced.

use std::hash::{Hash, Hasher};
use std::path::Path;

use anyhow::Context as _;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Compiles `bytes`, or loads the artifact compiled from them before.
pub fn load(engine: &Engine, bytes: &[u8], cache_dir: Option<&Path>) -> anyhow::Result<Component> {
    let Some(dir) = cache_dir else {
        return Ok(Component::new(engine, bytes)?);
    };
    let mut engine_hash = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut engine_hash);
    let key = format!("{:x}-{:016x}", Sha256::digest(bytes), engine_hash.finish());
    let file = dir.join(format!("{key}.cwasm"));
    if file.exists() {
        match deserialize(engine, &file) {
            Ok(component) => {
                tracing::debug!(path = %file.display(), "loaded compiled sink from cache");
                return Ok(component);
            }
            Err(e) => {
                tracing::warn!(path = %file.display(), error = %e, "ignoring unusable compile cache entry")
            }
        }
    }
    let component = Component::new(engine, bytes)?;
    if let Err(e) = store(&component, dir, &file) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not write the compile cache; the next start compiles again");
    }
    Ok(component)
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, file: &Path) -> anyhow::Result<Component> {
    // SAFETY: the file is one this module wrote from `Component::serialize` under a key that
    // includes the engine's compatibility hash; wasmtime additionally checks the header and
    // refuses artifacts from another version or configuration.
    Ok(unsafe { Component::deserialize_file(engine, file) }?)
}

fn store(component: &Component, dir: &Path, file: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let bytes = component.serialize()?;
    // Write then rename, so a concurrent starter never reads half a file.
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, file)?;
    Ok(())
}
