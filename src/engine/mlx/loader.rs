//! Reading an MLX conversion folder: `config.json`, the safetensors shards
//! (one file, or several named by `model.safetensors.index.json`), and the
//! quantization of each module (`quantization: {group_size, bits, <module>:
//! {...} | false}` as mlx-lm writes it).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use serde::Deserialize;
use serde_json::Value;

use super::{MlxError, MlxResult};

/// MLX affine quantization parameters of one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct Quant {
    pub group_size: i32,
    pub bits: i32,
}

const SUPPORTED_BITS: [i32; 6] = [2, 3, 4, 5, 6, 8];
const SUPPORTED_GROUPS: [i32; 3] = [32, 64, 128];

impl Quant {
    fn checked(self, module: &str) -> MlxResult<Self> {
        if !SUPPORTED_BITS.contains(&self.bits) || !SUPPORTED_GROUPS.contains(&self.group_size) {
            return Err(MlxError::Config(format!(
                "{module}: quantization of {} bits in groups of {} is not supported \
                 (bits 2, 3, 4, 5, 6 or 8; groups of 32, 64 or 128)",
                self.bits, self.group_size
            )));
        }
        Ok(self)
    }
}

/// The raw `config.json` of a conversion ([`crate::model_config::read`]).
pub fn read_config(dir: &Path) -> MlxResult<Value> {
    crate::model_config::read(dir).map_err(MlxError::Config)
}

/// The checkpoint's tensors, handed out once each by name.
///
/// Architectures `take` what they need; [`Weights::finish`] then reports any
/// tensor nobody took, so a checkpoint that does not match the architecture
/// fails loudly instead of serving with weights silently ignored.
pub struct Weights {
    tensors: RefCell<HashMap<String, Array>>,
    /// How the model is held and run (see [`super::options::LoadOptions`]).
    pub options: super::options::LoadOptions,
    default_quant: Option<Quant>,
    overrides: HashMap<String, Option<Quant>>,
}

impl Weights {
    pub fn load(
        dir: &Path,
        config: &Value,
        options: super::options::LoadOptions,
    ) -> MlxResult<Self> {
        let mut tensors = HashMap::new();
        let files = shard_files(dir)?;
        for (i, file) in files.iter().enumerate() {
            let started = std::time::Instant::now();
            let part = Array::load_safetensors(file)
                .map_err(|e| MlxError::Config(format!("cannot load {}: {e}", file.display())))?;
            // Read now: MLX loads lazily, which would leave the reading to
            // the first request (on Metal, the whole model's).
            mlx_rs::transforms::eval(part.values())?;
            let bytes: usize = part.values().map(Array::nbytes).sum();
            tracing::info!(
                "read {} ({} of {}): {:.1} MiB in {:.1} s",
                file.file_name().unwrap_or_default().to_string_lossy(),
                i + 1,
                files.len(),
                bytes as f64 / (1u64 << 20) as f64,
                started.elapsed().as_secs_f64()
            );
            tensors.extend(part);
        }
        let (default_quant, overrides) = parse_quantization(config)?;
        Ok(Weights {
            tensors: RefCell::new(tensors),
            options,
            default_quant,
            overrides,
        })
    }

    /// Removes and returns the tensor `name`.
    pub fn take(&self, name: &str) -> MlxResult<Array> {
        self.tensors
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| MlxError::Config(format!("the checkpoint has no tensor `{name}`")))
    }

    /// Removes and returns the tensor `name` if the checkpoint has it.
    pub fn optional(&self, name: &str) -> Option<Array> {
        self.tensors.borrow_mut().remove(name)
    }

    /// Whether the checkpoint has a tensor `name` (not yet taken).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.borrow().contains_key(name)
    }

    /// How the module `module` is quantized, or `None` if it is dense.
    pub fn quant(&self, module: &str) -> Option<Quant> {
        if let Some(q) = self.overrides.get(module) {
            return *q;
        }
        if self.contains(&format!("{module}.scales")) {
            self.default_quant
        } else {
            None
        }
    }

    /// Drops every tensor whose name starts with one of `prefixes` (parts of
    /// the checkpoint the text model does not use, such as a vision tower).
    pub fn skip(&self, prefixes: &[&str]) {
        self.tensors
            .borrow_mut()
            .retain(|k, _| !prefixes.iter().any(|p| k.starts_with(p)));
    }

    /// Drops every tensor whose name `unused` accepts (tensors a conversion
    /// may carry that the model does not compute with).
    pub fn skip_where(&self, unused: impl Fn(&str) -> bool) {
        self.tensors.borrow_mut().retain(|k, _| !unused(k));
    }

    /// Fails if tensors are left over.
    pub fn finish(self) -> MlxResult<()> {
        let left: BTreeSet<String> = self.tensors.into_inner().into_keys().collect();
        if left.is_empty() {
            return Ok(());
        }
        let shown: Vec<_> = left.iter().take(8).cloned().collect();
        Err(MlxError::Config(format!(
            "the checkpoint has {} tensors this architecture does not use (for example {}); \
             is --model the right conversion for its config.json?",
            left.len(),
            shown.join(", ")
        )))
    }
}

/// The folder's `.safetensors` files and their sizes on disk, by name,
/// from the listing alone (nothing is loaded).
pub fn safetensors_sizes(dir: &Path) -> MlxResult<Vec<(String, u64)>> {
    let listing = std::fs::read_dir(dir)
        .map_err(|e| MlxError::Config(format!("cannot list {}: {e}", dir.display())))?;
    let mut files = Vec::new();
    for entry in listing.filter_map(Result::ok) {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "safetensors") {
            let size = std::fs::metadata(&path)
                .map_err(|e| MlxError::Config(format!("cannot read {}: {e}", path.display())))?
                .len();
            files.push((entry.file_name().to_string_lossy().into_owned(), size));
        }
    }
    files.sort();
    Ok(files)
}

/// The bytes of a conversion's weights: the sizes on disk of the folder's
/// `.safetensors` files (what MLX holds of them, before any dequantized
/// copy). Read from the listing alone, before anything is loaded.
pub fn weight_bytes(dir: &Path) -> MlxResult<usize> {
    Ok(safetensors_sizes(dir)?
        .iter()
        .map(|(_, b)| *b as usize)
        .sum())
}

fn shard_files(dir: &Path) -> MlxResult<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index)
            .map_err(|e| MlxError::Config(format!("cannot read {}: {e}", index.display())))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| MlxError::Config(format!("{} is not valid JSON: {e}", index.display())))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| MlxError::Config(format!("{} has no weight_map", index.display())))?;
        let files: BTreeSet<&str> = map.values().filter_map(Value::as_str).collect();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| MlxError::Config(format!("cannot list {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(MlxError::Config(format!(
            "{} holds no .safetensors files; --model must name an MLX conversion folder \
             (decisio convert turns a GGUF file into one)",
            dir.display()
        )));
    }
    Ok(files)
}

type QuantTable = (Option<Quant>, HashMap<String, Option<Quant>>);

fn parse_quantization(config: &Value) -> MlxResult<QuantTable> {
    let Some(q) = config.get("quantization").and_then(Value::as_object) else {
        return Ok((None, HashMap::new()));
    };
    if let Some(mode) = q.get("mode").and_then(Value::as_str) {
        if mode != "affine" {
            return Err(MlxError::Config(format!(
                "quantization mode `{mode}` is not supported; use an affine (mlx-lm default) conversion"
            )));
        }
    }
    let mut default = None;
    if let (Some(g), Some(b)) = (q.get("group_size"), q.get("bits")) {
        let quant = Quant {
            group_size: g.as_i64().unwrap_or(0) as i32,
            bits: b.as_i64().unwrap_or(0) as i32,
        };
        default = Some(quant.checked("quantization")?);
    }
    let mut overrides = HashMap::new();
    for (module, value) in q {
        match value {
            Value::Object(_) => {
                let quant: Quant = serde_json::from_value(value.clone()).map_err(|e| {
                    MlxError::Config(format!("quantization of {module} is malformed: {e}"))
                })?;
                overrides.insert(module.clone(), Some(quant.checked(module)?));
            }
            Value::Bool(false) => {
                overrides.insert(module.clone(), None);
            }
            _ => {}
        }
    }
    Ok((default, overrides))
}
