//! Where the stack's programs and files are: the workspace's `target/`, the project
//! virtualenv (`.venv/bin`, made by `scripts/setup.sh`), or environment overrides.

use std::path::{Path, PathBuf};

use crate::error::StackError;

/// The command that builds the Rust binaries the stack runs.
pub const BUILD_BINS: &str = "cargo build --workspace --bins";
/// The command that builds the filter.
pub const BUILD_FILTER: &str =
    "cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm";

/// Which cargo profile's binaries to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// `target/debug/`.
    #[default]
    Debug,
    /// `target/release/`.
    Release,
}

impl Profile {
    fn dir(self) -> &'static str {
        match self {
            Profile::Debug => "debug",
            Profile::Release => "release",
        }
    }

    fn build_flag(self) -> &'static str {
        match self {
            Profile::Debug => "",
            Profile::Release => " --release",
        }
    }
}

/// Every program and file the stack needs, located and checked to exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifacts {
    /// Envoy (`SWITCHYARD_ENVOY`, default `.venv/bin/envoy`).
    pub envoy: PathBuf,
    /// nats-server (`SWITCHYARD_NATS_SERVER`, default `.venv/bin/nats-server`).
    pub nats_server: PathBuf,
    /// Control plane binary (`SWITCHYARD_CONTROL_PLANE_BIN`).
    pub control_plane: PathBuf,
    /// Simulated worker binary (`SWITCHYARD_SIM_WORKER_BIN`).
    pub sim_worker: PathBuf,
    /// The filter (`SWITCHYARD_FILTER_WASM`).
    pub filter_wasm: PathBuf,
    /// Tokenizer and chat template (`SWITCHYARD_MODEL_DIR`, default `.cache/models/qwen3`).
    pub model_dir: PathBuf,
    /// The status page's what-if module (`SWITCHYARD_WHATIF_DIR`, default `<target>/whatif`,
    /// built by `scripts/build-whatif.sh`), if it is there: optional, since without it only
    /// the page's what-if is unavailable.
    pub whatif_dir: Option<PathBuf>,
}

/// The workspace root (the parent of this crate's directory at build time).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.join(".."), Path::to_path_buf)
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `<workspace>/target`.
pub fn target_dir(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    match env("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join("target"),
    }
}

/// One artifact to find: its env override, its default path, what it is and how to get it.
struct Wanted {
    what: &'static str,
    env_var: &'static str,
    default: PathBuf,
    hint: String,
}

impl Wanted {
    fn resolve(self, env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf, StackError> {
        let path = match env(self.env_var) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => self.default,
        };
        if path.exists() {
            Ok(path)
        } else {
            Err(StackError::MissingArtifact {
                what: self.what,
                path,
                hint: format!("{} (or set {})", self.hint, self.env_var),
            })
        }
    }
}

impl Artifacts {
    /// Locates everything from the process environment.
    ///
    /// # Errors
    /// [`StackError::MissingArtifact`] for the first thing missing, naming the command that
    /// builds or installs it.
    pub fn locate(profile: Profile) -> Result<Artifacts, StackError> {
        Self::locate_with(profile, &|name| std::env::var(name).ok())
    }

    /// Locates everything, reading variables through `env` (tests pass a map).
    ///
    /// # Errors
    /// As [`Artifacts::locate`].
    pub fn locate_with(
        profile: Profile,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Artifacts, StackError> {
        let root = workspace_root();
        let target = target_dir(env);
        let bins = target.join(profile.dir());
        let build_bins = format!("build it with `{BUILD_BINS}{}`", profile.build_flag());
        let setup = "run `scripts/setup.sh`".to_string();
        Ok(Artifacts {
            envoy: Wanted {
                what: "Envoy",
                env_var: "SWITCHYARD_ENVOY",
                default: root.join(".venv/bin/envoy"),
                hint: setup.clone(),
            }
            .resolve(env)?,
            nats_server: Wanted {
                what: "nats-server",
                env_var: switchyard_support::nats::PROGRAM_ENV,
                default: root.join(".venv/bin/nats-server"),
                hint: setup.clone(),
            }
            .resolve(env)?,
            model_dir: Wanted {
                what: "model directory (tokenizer)",
                env_var: "SWITCHYARD_MODEL_DIR",
                default: root.join(".cache/models/qwen3"),
                hint: setup,
            }
            .resolve(env)?,
            control_plane: Wanted {
                what: "control plane binary",
                env_var: "SWITCHYARD_CONTROL_PLANE_BIN",
                default: bins.join("switchyard-control-plane"),
                hint: build_bins.clone(),
            }
            .resolve(env)?,
            sim_worker: Wanted {
                what: "simulated worker binary",
                env_var: "SWITCHYARD_SIM_WORKER_BIN",
                default: bins.join("switchyard-sim-worker"),
                hint: build_bins,
            }
            .resolve(env)?,
            filter_wasm: Wanted {
                what: "filter wasm",
                env_var: "SWITCHYARD_FILTER_WASM",
                default: target.join("wasm32-wasip1/wasm/switchyard_filter.wasm"),
                hint: format!("build it with `{BUILD_FILTER}`"),
            }
            .resolve(env)?,
            whatif_dir: Wanted {
                what: "status page what-if",
                env_var: "SWITCHYARD_WHATIF_DIR",
                default: target.join("whatif"),
                hint: "build it with `scripts/build-whatif.sh`".into(),
            }
            .resolve(env)
            .ok(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// An environment where the external tools and the model resolve to an existing path
    /// (the temp dir), plus `more`.
    fn env_with(more: &[(&'static str, String)]) -> HashMap<&'static str, String> {
        let existing = std::env::temp_dir().to_string_lossy().to_string();
        [
            "SWITCHYARD_ENVOY",
            "SWITCHYARD_NATS_SERVER",
            "SWITCHYARD_MODEL_DIR",
        ]
        .into_iter()
        .map(|k| (k, existing.clone()))
        .chain(more.iter().cloned())
        .collect()
    }

    #[test]
    fn a_missing_binary_names_the_build_command() {
        let no_target = std::env::temp_dir().join("switchyard-no-such-target");
        let vars = env_with(&[("CARGO_TARGET_DIR", no_target.to_string_lossy().into())]);
        let env = |k: &str| vars.get(k).cloned();
        let err = Artifacts::locate_with(Profile::Release, &env).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("control plane binary"), "{message}");
        assert!(
            message.contains("cargo build --workspace --bins --release"),
            "{message}"
        );
        assert!(
            message.contains("SWITCHYARD_CONTROL_PLANE_BIN"),
            "{message}"
        );
    }

    #[test]
    fn the_what_if_is_optional_and_found_by_its_override() {
        let dir = std::env::temp_dir();
        let existing = dir.to_string_lossy().to_string();
        let with = |whatif: String| {
            let vars = env_with(&[
                ("SWITCHYARD_CONTROL_PLANE_BIN", existing.clone()),
                ("SWITCHYARD_SIM_WORKER_BIN", existing.clone()),
                ("SWITCHYARD_FILTER_WASM", existing.clone()),
                ("SWITCHYARD_WHATIF_DIR", whatif),
            ]);
            let env = |k: &str| vars.get(k).cloned();
            Artifacts::locate_with(Profile::Debug, &env).map(|a| a.whatif_dir)
        };
        assert_eq!(with(existing.clone()).unwrap(), Some(dir.clone()));
        let missing = dir.join("switchyard-no-such-whatif");
        assert_eq!(with(missing.to_string_lossy().into()).unwrap(), None);
    }

    #[test]
    fn overrides_win_and_the_filter_hint_names_the_wasm_build() {
        let dir = std::env::temp_dir();
        let existing = dir.to_string_lossy().to_string();
        let vars = env_with(&[
            ("SWITCHYARD_CONTROL_PLANE_BIN", existing.clone()),
            ("SWITCHYARD_SIM_WORKER_BIN", existing),
            (
                "SWITCHYARD_FILTER_WASM",
                dir.join("nope.wasm").to_string_lossy().into(),
            ),
        ]);
        let env = |k: &str| vars.get(k).cloned();
        let message = Artifacts::locate_with(Profile::Debug, &env)
            .unwrap_err()
            .to_string();
        assert!(message.contains(BUILD_FILTER), "{message}");
        assert!(message.contains("nope.wasm"), "{message}");
    }
}
