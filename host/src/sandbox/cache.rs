//! Compiled components cached on disk, so a restart does not recompile the sink.
//!
//! A cache entry is native code that the host runs, so the cache must not be a way in.
//! Trust model: the cache belongs to the user the host runs as, and only that user can add
//! an entry the host will load.
//!
//! - The directory is created `0700`; one that another user owns, or that is group- or
//!   world-writable, is refused at start with a message naming `sink.cache_dir`.
//! - The directory holds a random 32-byte key (`cache.key`, `0600`). Every entry ends with an
//!   HMAC-SHA256 under that key over the entry's name and contents; an entry whose tag does
//!   not verify (planted, copied from elsewhere, renamed, corrupt) is never deserialised: it
//!   is recompiled and replaced. Someone who can read the key can already act as this user.
//! - Entries are written to a fresh temporary file (`create_new`, so a planted symlink is
//!   never followed) and renamed into place; symlinked entries are never read.
//!
//! The entry's name covers the component's SHA-256 and the engine's compatibility hash
//! (wasmtime version and every setting that changes code generation).

use std::fs::{self, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use anyhow::Context as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

const KEY_FILE: &str = "cache.key";
const KEY_LEN: usize = 32;
const TAG_LEN: usize = 32;

/// A checked cache directory and its key.
pub struct Cache {
    dir: std::path::PathBuf,
    key: Vec<u8>,
}

/// Opens (or creates) the cache in `dir`, refusing a directory others could write.
pub fn open(dir: &Path) -> anyhow::Result<Cache> {
    let key = private_dir(dir).and_then(|()| cache_key(dir)).map_err(|e| {
        anyhow::anyhow!("sink.cache_dir: {e:#} (fix it, or set sink.cache_dir to \"\" to compile at every start)")
    })?;
    Ok(Cache { dir: dir.to_owned(), key })
}

/// Compiles `bytes`, or loads the artifact compiled from them before.
pub fn load(engine: &Engine, bytes: &[u8], cache: Option<&Cache>) -> anyhow::Result<Component> {
    let Some(Cache { dir, key }) = cache else {
        return Ok(Component::new(engine, bytes)?);
    };
    let (dir, key) = (dir.as_path(), key.as_slice());
    let mut engine_hash = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut engine_hash);
    let name = format!("{:x}-{:016x}.cwasm", Sha256::digest(bytes), engine_hash.finish());
    let file = dir.join(&name);
    match read_verified(&file, &name, key) {
        Ok(Some(artifact)) => match deserialize(engine, &artifact) {
            Ok(component) => {
                tracing::debug!(path = %file.display(), "loaded compiled sink from cache");
                return Ok(component);
            }
            Err(e) => tracing::warn!(path = %file.display(), error = %e, "ignoring unusable compile cache entry"),
        },
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(path = %file.display(), error = %e, "ignoring a compile cache entry that does not verify")
        }
    }
    let component = Component::new(engine, bytes)?;
    if let Err(e) = store(&component, dir, &name, key) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not write the compile cache; the next start compiles again");
    }
    Ok(component)
}

/// The user the host runs as, from `/proc/self` (owned by the process's effective user).
fn own_uid() -> anyhow::Result<u32> {
    Ok(fs::metadata("/proc/self").context("reading /proc/self")?.uid())
}

/// Creates `dir` as `0700`, or checks that an existing one is ours and not writable by others.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let meta = fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if !meta.is_dir() {
        anyhow::bail!("{} is not a directory (a symlink is not accepted)", dir.display());
    }
    if meta.uid() != own_uid()? {
        anyhow::bail!("{} belongs to another user (uid {})", dir.display(), meta.uid());
    }
    if meta.mode() & 0o022 != 0 {
        anyhow::bail!(
            "{} is writable by other users (mode {:o}): anyone who can write there could make the host run their code; chmod 700 it",
            dir.display(),
            meta.mode() & 0o777
        );
    }
    Ok(())
}

/// The cache's HMAC key, made on first use.
fn cache_key(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let path = dir.join(KEY_FILE);
    let key = crate::clock::random_bytes(KEY_LEN);
    match write_new(&path, &key) {
        Ok(()) => return Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
    }
    let meta = fs::symlink_metadata(&path)?;
    if !meta.is_file() || meta.uid() != own_uid()? || meta.mode() & 0o077 != 0 || meta.len() != KEY_LEN as u64 {
        anyhow::bail!("{} is not a private {KEY_LEN}-byte key file of this user; remove it", path.display());
    }
    Ok(fs::read(&path)?)
}

fn tag(key: &[u8], name: &str, artifact: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(name.as_bytes());
    mac.update(&[0]);
    mac.update(artifact);
    mac
}

/// The entry's artifact if it exists and its tag verifies; `None` when there is no entry.
fn read_verified(file: &Path, name: &str, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
    let meta = match fs::symlink_metadata(file) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if !meta.is_file() {
        anyhow::bail!("not a regular file");
    }
    let mut entry = fs::read(file)?;
    if entry.len() < TAG_LEN {
        anyhow::bail!("too short to carry a tag");
    }
    let stored = entry.split_off(entry.len() - TAG_LEN);
    tag(key, name, &entry)
        .verify_slice(&stored)
        .map_err(|_| anyhow::anyhow!("its tag does not verify under this cache's key"))?;
    Ok(Some(entry))
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, artifact: &[u8]) -> anyhow::Result<Component> {
    // SAFETY: the artifact carries an HMAC under a key only this user can read, over this
    // entry's name (the component's digest and the engine's compatibility hash) and its
    // bytes: it is one this host wrote from `Component::serialize` for this component.
    // wasmtime additionally checks the header and refuses another version or configuration.
    Ok(unsafe { Component::deserialize(engine, artifact) }?)
}

fn store(component: &Component, dir: &Path, name: &str, key: &[u8]) -> anyhow::Result<()> {
    let mut entry = component.serialize()?;
    let mac = tag(key, name, &entry).finalize().into_bytes();
    entry.extend_from_slice(&mac);
    // A fresh file, then rename: a concurrent starter never reads half a file, and nothing
    // planted at the temporary path is followed.
    let suffix = crate::clock::hex(&crate::clock::random_bytes(8));
    let tmp = dir.join(format!(".{name}.{}.{suffix}.tmp", std::process::id()));
    write_new(&tmp, &entry).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })?;
    Ok(())
}

/// Writes a new private file; fails if anything (a file, a symlink) is already at `path`.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    // `mode` is filtered by the umask; make sure nobody else can read a key.
    file.set_permissions(fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_symlink_at_a_new_file_path_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let planted = dir.path().join("entry.tmp");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let err = write_new(&planted, b"overwritten?").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn a_directory_others_can_write_is_refused_and_a_new_one_is_private() {
        let base = tempfile::tempdir().unwrap();
        let fresh = base.path().join("cache");
        private_dir(&fresh).unwrap();
        assert_eq!(fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);

        fs::set_permissions(&fresh, fs::Permissions::from_mode(0o777)).unwrap();
        let err = private_dir(&fresh).unwrap_err().to_string();
        assert!(err.contains("writable by other users (mode 777)"), "{err}");
    }

    #[test]
    fn an_entry_verifies_only_under_its_key_and_name() {
        let dir = tempfile::tempdir().unwrap();
        private_dir(dir.path()).unwrap();
        let key = cache_key(dir.path()).unwrap();
        assert_eq!(cache_key(dir.path()).unwrap(), key, "the key is kept");
        assert_eq!(fs::metadata(dir.path().join(KEY_FILE)).unwrap().mode() & 0o777, 0o600);

        let mut entry = b"native code".to_vec();
        entry.extend_from_slice(&tag(&key, "a.cwasm", b"native code").finalize().into_bytes());
        fs::write(dir.path().join("a.cwasm"), &entry).unwrap();
        fs::write(dir.path().join("b.cwasm"), &entry).unwrap();
        assert_eq!(read_verified(&dir.path().join("a.cwasm"), "a.cwasm", &key).unwrap().unwrap(), b"native code");
        assert!(read_verified(&dir.path().join("b.cwasm"), "b.cwasm", &key).is_err(), "a renamed entry verified");
        assert!(read_verified(&dir.path().join("a.cwasm"), "a.cwasm", &[7; 32]).is_err(), "another key verified");
        assert_eq!(read_verified(&dir.path().join("none.cwasm"), "none.cwasm", &key).unwrap(), None);
    }
}
