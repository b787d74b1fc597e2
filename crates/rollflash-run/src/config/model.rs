//! `[model]`: which policy a run starts from, on which device and in which precision, and
//! how conversations become tokens.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which policy to start from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// A Hugging Face directory; empty means the built-in tiny model.
    pub path: Option<PathBuf>,
    /// Where the trainer and the embedded engines keep their tensors: `cpu`, or `cuda:N`
    /// (a build with the `cuda` feature).
    pub device: DeviceSpec,
    /// Precision of the weights and activations: `f32` (`bf16` and `f16` on CUDA only: the
    /// CPU kernels are f32).
    pub dtype: DTypeSpec,
}

/// How conversations become tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RendererChoice {
    /// The model directory's chat template when it has one (and is not a directory rollflash
    /// saved from its built-in model, which was trained on plain text); plain text otherwise.
    #[default]
    Auto,
    /// Plain text, turns joined by newlines.
    Plain,
    /// The model directory's chat template; refused when it has none.
    Chat,
}

/// A device as configs write it: `cpu` or `cuda:N`. Parsed once, by serde.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Cuda(usize),
}

impl TryFrom<String> for DeviceSpec {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| format!("unknown device `{other}` (cpu, cuda:N)")),
        }
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DeviceSpec::try_from(s.to_string())
    }
}

impl std::str::FromStr for DTypeSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(DTypeSpec::F32),
            "bf16" => Ok(DTypeSpec::Bf16),
            "f16" => Ok(DTypeSpec::F16),
            other => Err(format!("unknown dtype `{other}` (f32, bf16, f16)")),
        }
    }
}

impl From<DeviceSpec> for String {
    fn from(d: DeviceSpec) -> String {
        match d {
            DeviceSpec::Cpu => "cpu".into(),
            DeviceSpec::Cuda(n) => format!("cuda:{n}"),
        }
    }
}

/// A tensor precision as configs write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DTypeSpec {
    #[default]
    F32,
    Bf16,
    F16,
}
