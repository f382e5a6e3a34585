//! The quantization of a conversion in mlx-lm's terms: the group size and
//! bits of each quantized module, and the `quantization` entry of
//! `config.json` they add up to.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Map, Value};

/// Group size and bits of one quantized module (MLX affine mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QuantParams {
    pub group_size: u32,
    pub bits: u32,
}

impl QuantParams {
    fn to_json(self) -> Value {
        json!({"group_size": self.group_size, "bits": self.bits, "mode": "affine"})
    }
}

impl std::fmt::Display for QuantParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-bit, group size {}", self.bits, self.group_size)
    }
}

/// The quantization of a converted model in mlx-lm's terms: the parameters
/// most modules share, and the modules that differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantConfig {
    pub default: QuantParams,
    /// Module path (`model.embed_tokens`) to its own parameters.
    pub overrides: BTreeMap<String, QuantParams>,
}

impl QuantConfig {
    /// The majority parameters become the default (ties go to the larger
    /// bit width, then the larger group); every module that differs is
    /// listed. `None` when no module is quantized.
    pub fn from_modules(modules: &BTreeMap<String, QuantParams>) -> Option<Self> {
        let mut counts: HashMap<QuantParams, usize> = HashMap::new();
        for params in modules.values() {
            *counts.entry(*params).or_default() += 1;
        }
        let default = counts
            .into_iter()
            .max_by_key(|(params, count)| (*count, params.bits, params.group_size))?
            .0;
        let overrides = modules
            .iter()
            .filter(|(_, params)| **params != default)
            .map(|(path, params)| (path.clone(), *params))
            .collect();
        Some(Self { default, overrides })
    }

    /// The `quantization` value of mlx-lm's config.json.
    pub fn to_json(&self) -> Value {
        let mut map = Map::new();
        map.insert("group_size".into(), self.default.group_size.into());
        map.insert("bits".into(), self.default.bits.into());
        map.insert("mode".into(), "affine".into());
        for (path, params) in &self.overrides {
            map.insert(path.clone(), params.to_json());
        }
        Value::Object(map)
    }
}

impl std::fmt::Display for QuantConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.default)?;
        for (path, params) in &self.overrides {
            write!(f, "; {path}: {params}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_majority_and_overrides() {
        let q4 = QuantParams {
            group_size: 32,
            bits: 4,
        };
        let q8 = QuantParams {
            group_size: 32,
            bits: 8,
        };
        let mut modules = BTreeMap::new();
        modules.insert("model.embed_tokens".to_owned(), q8);
        for i in 0..3 {
            modules.insert(format!("model.layers.{i}.mlp.up_proj"), q4);
        }
        let config = QuantConfig::from_modules(&modules).unwrap();
        assert_eq!(config.default, q4);
        assert_eq!(
            config.to_json(),
            json!({"group_size": 32, "bits": 4, "mode": "affine",
                   "model.embed_tokens": {"group_size": 32, "bits": 8, "mode": "affine"}})
        );
        assert_eq!(QuantConfig::from_modules(&BTreeMap::new()), None);
    }
}
