//! Which versions of the sink contract (package `outbox:sink`, `wit/sink.wit`) this host
//! runs: a sink built for any `0.1.x` up to the host's own. A 0.1.x release only adds, and
//! the linker resolves an older 0.1 import against the newer definitions by semver. Other
//! versions are refused by name before linking, rather than with the linker's list of
//! missing imports.

use std::collections::BTreeSet;

use wasmtime::Engine;
use wasmtime::component::Component;

/// The contract's package.
pub const PACKAGE: &str = "outbox:sink";
/// The version of `wit/sink.wit` this host is built from.
pub const VERSION: Version = Version { major: 0, minor: 1, patch: 3 };

/// A plain `major.minor.patch` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Major.
    pub major: u64,
    /// Minor: with major 0, the part that changes when something is removed or changed.
    pub minor: u64,
    /// Patch.
    pub patch: u64,
}

impl Version {
    fn parse(text: &str) -> Option<Version> {
        let mut parts = text.split('.').map(|p| p.parse::<u64>().ok());
        let version = Version { major: parts.next()??, minor: parts.next()??, patch: parts.next()?? };
        parts.next().is_none().then_some(version)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The versions of the contract a component's imports name (`outbox:sink/log@0.1.0` names
/// `0.1.0`), as written.
pub fn targets(engine: &Engine, component: &Component) -> BTreeSet<String> {
    targets_of(engine, component, PACKAGE)
}

/// [`targets`] of another contract's `package` (a relay's `outbox:relay`).
pub fn targets_of(engine: &Engine, component: &Component, package: &str) -> BTreeSet<String> {
    let prefix = format!("{package}/");
    component
        .component_type()
        .imports(engine)
        .filter_map(|(name, _)| name.strip_prefix(&prefix)?.split_once('@').map(|(_, v)| v.to_string()))
        .collect()
}

/// Whether this host runs a sink built for these contract versions; the refusal names the
/// version the sink was built for and the versions the host offers.
pub fn check(targets: &BTreeSet<String>) -> Result<(), String> {
    check_package(PACKAGE, VERSION, "the sink against this host's wit/sink.wit", targets)
}

/// [`check`] for another contract: `package` at `version` (the relay's); `rebuild` says
/// what to build against what.
pub fn check_package(package: &str, version: Version, rebuild: &str, targets: &BTreeSet<String>) -> Result<(), String> {
    let offered = format!(
        "this host offers {package}@{}.{}.0 to {version} (a sink built for any of them loads)",
        version.major, version.minor
    );
    for target in targets {
        let why = match Version::parse(target) {
            Some(v) if (v.major, v.minor) == (version.major, version.minor) && v <= version => continue,
            Some(v) if (v.major, v.minor) == (version.major, version.minor) => {
                "newer than this host: it may call what this host does not have; run a newer host"
            }
            Some(_) => &format!("a contract this host does not speak: build {rebuild}"),
            None => "not a version this host knows",
        };
        return Err(format!("was built for {package}@{target}, {why}; {offered}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_one(version: &str) -> Result<(), String> {
        check(&[version.to_string()].into())
    }

    #[test]
    fn every_0_1_x_up_to_the_hosts_own_is_run() {
        assert_eq!(check_one("0.1.0"), Ok(()));
        assert_eq!(check_one(&VERSION.to_string()), Ok(()));
        assert_eq!(check(&BTreeSet::new()), Ok(()), "nothing named: the linker has the last word");
    }

    #[test]
    fn other_versions_are_refused_naming_both_sides() {
        let newer = format!("{}.{}.{}", VERSION.major, VERSION.minor, VERSION.patch + 1);
        for (target, why) in [
            ("0.2.0", "does not speak"),
            ("1.0.0", "does not speak"),
            (newer.as_str(), "newer than this host"),
            ("0.1.0-rc1", "not a version this host knows"),
        ] {
            let refused = check_one(target).unwrap_err();
            assert!(refused.starts_with(&format!("was built for outbox:sink@{target}, ")), "{refused}");
            assert!(refused.contains(why), "{refused}");
            assert!(
                refused.ends_with(&format!(
                    "this host offers outbox:sink@0.1.0 to {VERSION} (a sink built for any of them loads)"
                )),
                "{refused}"
            );
        }
    }
}
