//! Sampler weights as files: the `tinker://<model>/sampler_weights/<name>` paths
//! `save_weights_for_sampler` returns, and the archive a server sends for one (SkyRL: a
//! `.tar.gz` of a PEFT adapter, `adapter_config.json` and `adapter_model.safetensors`), so
//! that backends other than the server's own samplers (vLLM, SGLang, an embedded engine) can
//! load what the server trained.

use std::io::Read;
use std::path::{Path, PathBuf};

/// A sampler checkpoint's `tinker://` path, split into the training run (the model id) and
/// the checkpoint's name: the two ids of the archive route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplerPath {
    pub model_id: String,
    pub name: String,
}

impl SamplerPath {
    /// Parses `tinker://<model>/sampler_weights/<name>` (the SDK's form) or
    /// `tinker://<model>/<name>` (what SkyRL 0.4.0's `save_weights_for_sampler` returns; it
    /// accepts both); `None` for anything else (training state saved with `save_state` is
    /// `…/weights/…` and has no archive of this kind).
    pub fn parse(uri: &str) -> Option<SamplerPath> {
        let rest = uri.strip_prefix("tinker://")?;
        let (model_id, rest) = rest.split_once('/')?;
        let name = rest.strip_prefix("sampler_weights/").unwrap_or(rest);
        let id = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        (id(model_id) && id(name)).then(|| SamplerPath {
            model_id: model_id.to_string(),
            name: name.to_string(),
        })
    }
}

/// An archive that is not a usable adapter.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot read the archive")]
    Read(#[source] std::io::Error),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the archive entry {entry:?} is not a plain file name")]
    Entry { entry: String },
    #[error("the archive has no {file}: not a PEFT adapter")]
    Missing { file: &'static str },
}

/// The files an adapter directory must have (PEFT's names).
const ADAPTER_FILES: [&str; 2] = ["adapter_config.json", "adapter_model.safetensors"];

/// Unpacks a gzipped tar of a PEFT adapter into `dir` (created if missing) and returns the
/// files written. Only regular files are taken, each by its base name (SkyRL packs them at
/// the archive's root, possibly under `./`); a link, a device or a path that climbs out
/// is refused rather than followed.
pub fn unpack_adapter(archive: &[u8], dir: &Path) -> Result<Vec<PathBuf>, ArchiveError> {
    std::fs::create_dir_all(dir).map_err(|source| ArchiveError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let mut written = Vec::new();
    for entry in tar.entries().map_err(ArchiveError::Read)? {
        let mut entry = entry.map_err(ArchiveError::Read)?;
        let path = entry.path().map_err(ArchiveError::Read)?.into_owned();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        let shown = path.display().to_string();
        let mut parts = path
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir));
        let name = match (parts.next(), parts.next(), kind.is_file()) {
            (Some(std::path::Component::Normal(n)), None, true) => n.to_owned(),
            _ => return Err(ArchiveError::Entry { entry: shown }),
        };
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(ArchiveError::Read)?;
        let out = dir.join(name);
        std::fs::write(&out, bytes).map_err(|source| ArchiveError::Write {
            path: out.clone(),
            source,
        })?;
        written.push(out);
    }
    for file in ADAPTER_FILES {
        if !written.iter().any(|p| p.file_name() == Some(file.as_ref())) {
            return Err(ArchiveError::Missing { file });
        }
    }
    Ok(written)
}
