//! The production bases: which MLX conversions serve each, which tokenizer
//! builds its prompts, and the settings it brings.
//!
//! Everything a base decides lives in [`BASES`], as data. `decisio serve`
//! picks a base with `--base NAME` (or `--base org/repository`, whose
//! config.json says which base it is), or infers it from the conversion's
//! config.json; [`choose`] applies the refusals (FP8 checkpoints, conversions
//! that are not shipped) before any weight is read.

use serde_json::Value;

use crate::model_config;

mod format;

pub use format::{AnswerSlot, LabelVariants, Layout, NoulRendering, PromptFormat, WireSettings};

/// How a conversion of a base is offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offer {
    /// The conversion `--model` defaults to.
    Default,
    /// Served when asked for; the note says for whom.
    Option(&'static str),
    /// Refused at start-up, for the reason given.
    Refused(&'static str),
}

/// One MLX conversion of a base.
#[derive(Clone, Copy, Debug)]
pub struct Conversion {
    pub repository: &'static str,
    pub bits: u32,
    pub offer: Offer,
}

/// Where a base's prompts come from: its official tokenizer and chat
/// template, at a pinned revision where one is recorded.
#[derive(Clone, Copy, Debug)]
pub struct TokenizerSource {
    pub repository: &'static str,
    pub revision: Option<&'static str>,
}

/// How a base's config.json is recognised: its `model_type` (top level or
/// under `text_config`) and the depth of its text model.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub model_types: &'static [&'static str],
    pub num_hidden_layers: usize,
}

/// A production base and its settings.
#[derive(Clone, Copy, Debug)]
pub struct Base {
    /// The `--base` name.
    pub name: &'static str,
    /// The checkpoint it is a conversion of.
    pub checkpoint: &'static str,
    pub shape: Shape,
    pub conversions: &'static [Conversion],
    pub tokenizer: TokenizerSource,
    /// Default of `--prefix-cache-mb`.
    pub prefix_cache_mib: u64,
    /// Default of `--pad-block`: states are front-padded with newlines to a
    /// multiple of this many tokens, on both backends (`None`: not padded).
    /// The reference decisio's `pad_to` (`decisio/families.py`): the Qwen
    /// base's state ends on vLLM's 1,056-token block, the hybrid model's
    /// prefix-cache unit; the Gemma bases are not padded.
    pub pad_block: Option<usize>,
    /// Longest state the base is documented for; longer states run, with a
    /// warning in the log and the response.
    pub documented_state_tokens: Option<usize>,
    /// How System One questions are asked: the yes/no rendering and the
    /// temperatures of each question type, the reference decisio's for the
    /// base (`decisio/families.py`).
    pub wire: WireSettings,
}

/// The bases, the default first.
pub const BASES: &[Base] = &[
    Base {
        name: "qwen3.6-35b-a3b",
        checkpoint: "Qwen/Qwen3.6-35B-A3B",
        shape: Shape {
            model_types: &["qwen3_5_moe", "qwen3_5_moe_text"],
            num_hidden_layers: 40,
        },
        conversions: &[
            Conversion {
                repository: "mlx-community/Qwen3.6-35B-A3B-6bit",
                bits: 6,
                offer: Offer::Default,
            },
            Conversion {
                repository: "mlx-community/Qwen3.6-35B-A3B-4bit",
                bits: 4,
                offer: Offer::Option("for Macs with 32 GB of memory"),
            },
            Conversion {
                repository: "mlx-community/Qwen3.6-35B-A3B-8bit",
                bits: 8,
                offer: Offer::Refused(
                    "the 8-bit conversion is not shipped: it peaks at 39.4 GB at 32k tokens \
                     of state; use the 6-bit conversion (the default) or the 4-bit one",
                ),
            },
        ],
        tokenizer: TokenizerSource {
            repository: "Qwen/Qwen3.6-35B-A3B",
            revision: None,
        },
        prefix_cache_mib: 2048,
        pad_block: Some(1056),
        documented_state_tokens: None,
        wire: WireSettings::SERVED,
    },
    Base {
        name: "gemma-4-12b",
        checkpoint: "google/gemma-4-12B-it",
        shape: Shape {
            model_types: &["gemma4", "gemma4_unified", "gemma4_text"],
            num_hidden_layers: 48,
        },
        conversions: &[
            Conversion {
                repository: "mlx-community/gemma-4-12B-it-6bit",
                bits: 6,
                offer: Offer::Default,
            },
            Conversion {
                repository: "mlx-community/gemma-4-12B-it-4bit",
                bits: 4,
                offer: Offer::Refused(
                    "the 4-bit conversion fails the suite-accuracy gate; use the 6-bit \
                     conversion",
                ),
            },
        ],
        tokenizer: TokenizerSource {
            repository: "google/gemma-4-12B-it",
            revision: Some("706856c4cd89f5808166db543d84fda040caa492"),
        },
        prefix_cache_mib: 7400,
        pad_block: None,
        documented_state_tokens: None,
        wire: WireSettings {
            format: PromptFormat::GEMMA,
            noul: NoulRendering::Letters,
            choice_temperature: 3.592,
            temperature: 3.592,
        },
    },
    Base {
        name: "gemma-4-31b",
        checkpoint: "google/gemma-4-31B-it",
        shape: Shape {
            model_types: &["gemma4", "gemma4_text"],
            num_hidden_layers: 60,
        },
        conversions: &[Conversion {
            repository: "mlx-community/gemma-4-31b-it-6bit",
            bits: 6,
            offer: Offer::Default,
        }],
        tokenizer: TokenizerSource {
            repository: "google/gemma-4-31B-it",
            revision: Some("419b2efe421994fdfd3394e621983d4cc511cd4f"),
        },
        prefix_cache_mib: 2048,
        pad_block: None,
        documented_state_tokens: Some(16_383),
        wire: WireSettings {
            format: PromptFormat::GEMMA,
            noul: NoulRendering::Letters,
            choice_temperature: 4.672,
            temperature: 5.252,
        },
    },
];

/// The `--base` value that serves a model outside the bases with the
/// generic defaults (`docs/limits.md`).
pub const CUSTOM: &str = "custom";

/// The base a name selects, if any.
pub fn by_name(name: &str) -> Option<&'static Base> {
    BASES.iter().find(|b| b.name.eq_ignore_ascii_case(name))
}

/// The default base.
pub fn default_base() -> &'static Base {
    &BASES[0]
}

fn names() -> String {
    BASES
        .iter()
        .map(|b| b.name)
        .chain([CUSTOM])
        .collect::<Vec<_>>()
        .join(", ")
}

impl Base {
    /// The conversion `--model` defaults to.
    pub fn default_conversion(&self) -> &'static Conversion {
        self.conversions
            .iter()
            .find(|c| c.offer == Offer::Default)
            .unwrap_or(&self.conversions[0])
    }

    fn matches(&self, config: &Value) -> bool {
        let layers = model_config::text(config)
            .get("num_hidden_layers")
            .and_then(Value::as_u64);
        self.family(config) && layers == Some(self.shape.num_hidden_layers as u64)
    }

    fn family(&self, config: &Value) -> bool {
        model_config::model_types(config)
            .iter()
            .any(|t| self.shape.model_types.contains(t))
    }
}

/// Bits of an MLX conversion's weights (`quantization.bits`); `None` for
/// unquantized weights.
fn mlx_bits(config: &Value) -> Option<u32> {
    config
        .get("quantization")
        .or_else(|| config.get("quantization_config"))
        .and_then(|q| q.get("bits"))
        .and_then(Value::as_u64)
        .map(|b| b as u32)
}

/// Whether config.json declares FP8 weights (`quantization_config` with
/// `quant_method: fp8`, or compressed-tensors with 8-bit float weights).
pub fn declares_fp8(config: &Value) -> bool {
    let Some(q) = config.get("quantization_config") else {
        return false;
    };
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_lowercase();
    if method.contains("fp8") {
        return true;
    }
    let text = q.to_string().to_ascii_lowercase();
    method == "compressed-tensors" && (text.contains("\"float\"") || text.contains("fp8"))
}

/// What `--base` said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BaseArg {
    /// Not given: infer from the conversion.
    Infer,
    /// A base by name.
    Named(String),
    /// `custom`: a model outside the bases, with generic settings.
    Custom,
    /// A repository or folder whose config.json names the base.
    Checkpoint(String),
}

impl BaseArg {
    pub fn parse(arg: Option<&str>) -> BaseArg {
        match arg {
            None => BaseArg::Infer,
            Some(a) if a.eq_ignore_ascii_case(CUSTOM) => BaseArg::Custom,
            Some(a) if a.contains('/') || std::path::Path::new(a).is_dir() => {
                BaseArg::Checkpoint(a.to_string())
            }
            Some(a) => BaseArg::Named(a.to_string()),
        }
    }
}

/// Why a model cannot be served as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BaseError {
    #[error("--base `{0}` is not a base; the bases are: {bases}", bases = names())]
    UnknownName(String),
    #[error(
        "{what} declares FP8 quantization, which is vLLM's format; the MLX backend serves \
         MLX conversions: pass --model {conversion}{base_hint}"
    )]
    Fp8 {
        what: String,
        conversion: &'static str,
        base_hint: String,
    },
    #[error("`{repository}` is refused for base {base}: {reason}; pass --model {instead}")]
    RefusedConversion {
        repository: String,
        base: &'static str,
        reason: &'static str,
        instead: &'static str,
    },
    #[error(
        "{what} is a {model_type} model with {layers} layers, which is none of the bases \
         ({bases}); pass --base NAME to serve it with a base's settings, or --base custom \
         for the generic ones",
        bases = names()
    )]
    Unknown {
        what: String,
        model_type: String,
        layers: String,
    },
    #[error(
        "config.json of `{0}` matches no base ({bases}); pass --base NAME",
        bases = names()
    )]
    CheckpointNotABase(String),
}

/// Picks the base for a conversion and applies the refusals.
///
/// `model` names the conversion as the user gave it (a repository id or a
/// folder), `config` is its config.json; `base_config` is the config.json of
/// `--base <repository>` when one was given. `mlx` says whether the MLX
/// backend serves (FP8 checkpoints are vLLM's format and refused there).
/// `Ok(None)` means a model outside the bases, served with generic settings.
pub fn choose(
    arg: &BaseArg,
    model: &str,
    config: &Value,
    base_config: Option<&Value>,
    mlx: bool,
) -> Result<Option<&'static Base>, BaseError> {
    let named = match arg {
        BaseArg::Named(n) => Some(by_name(n).ok_or_else(|| BaseError::UnknownName(n.clone()))?),
        BaseArg::Checkpoint(repo) => {
            let c = base_config.unwrap_or(&Value::Null);
            let base = BASES.iter().find(|b| b.family(c));
            if mlx && declares_fp8(c) {
                let base = base.unwrap_or_else(default_base);
                return Err(BaseError::Fp8 {
                    what: format!("--base `{repo}`"),
                    conversion: base.default_conversion().repository,
                    base_hint: hint(base),
                });
            }
            Some(base.ok_or_else(|| BaseError::CheckpointNotABase(repo.clone()))?)
        }
        BaseArg::Custom | BaseArg::Infer => None,
    };
    if mlx && declares_fp8(config) {
        let base = named
            .or_else(|| BASES.iter().find(|b| b.family(config)))
            .unwrap_or_else(default_base);
        return Err(BaseError::Fp8 {
            what: format!("`{model}`"),
            conversion: base.default_conversion().repository,
            base_hint: hint(base),
        });
    }
    if *arg == BaseArg::Custom {
        return Ok(None);
    }
    // A base named explicitly wins over what config.json says: its settings
    // apply to any conversion (the small test conversions among them).
    let base = match named {
        Some(base) => base,
        None => match BASES.iter().find(|b| b.matches(config)) {
            Some(base) => base,
            None if BASES.iter().any(|b| b.family(config)) => {
                return Err(BaseError::Unknown {
                    what: format!("`{model}`"),
                    model_type: model_type(config),
                    layers: model_config::text(config)
                        .get("num_hidden_layers")
                        .map_or("an unknown number of".into(), |v| v.to_string()),
                });
            }
            None => return Ok(None),
        },
    };
    refuse_conversion(base, model, config)?;
    Ok(Some(base))
}

fn hint(base: &Base) -> String {
    if base.name == default_base().name {
        String::new()
    } else {
        format!(" --base {}", base.name)
    }
}

/// The language model's `model_type` (the nested one first).
fn model_type(config: &Value) -> String {
    model_config::model_types(config)
        .last()
        .copied()
        .unwrap_or("unknown")
        .to_string()
}

/// Refuses a conversion the base does not ship, by repository name or by the
/// bits its config.json declares.
fn refuse_conversion(base: &'static Base, model: &str, config: &Value) -> Result<(), BaseError> {
    let bits = mlx_bits(config);
    let named = base.conversions.iter().find(|c| {
        c.repository
            .eq_ignore_ascii_case(model.split('@').next().unwrap_or(model))
    });
    let refused = named
        .filter(|c| matches!(c.offer, Offer::Refused(_)))
        .or_else(|| {
            // By bits only for a conversion of the base's own architecture.
            base.conversions.iter().find(|c| {
                matches!(c.offer, Offer::Refused(_)) && Some(c.bits) == bits && base.family(config)
            })
        });
    if let Some(c) = refused {
        let Offer::Refused(reason) = c.offer else {
            unreachable!("filtered on Refused")
        };
        return Err(BaseError::RefusedConversion {
            repository: model.to_string(),
            base: base.name,
            reason,
            instead: base.default_conversion().repository,
        });
    }
    Ok(())
}

/// The warning for a state longer than the base is documented for.
pub fn long_state_warning(base: &Base, tokens: usize) -> Option<String> {
    let limit = base.documented_state_tokens?;
    (tokens > limit).then(|| {
        format!(
            "the state has {tokens} tokens; base {} is documented for states up to {limit} \
             tokens (it runs, with more memory than the documented figures)",
            base.name
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gemma(layers: u64, bits: Option<u64>) -> Value {
        let mut c = json!({"model_type": "gemma4", "text_config": {
            "model_type": "gemma4_text", "num_hidden_layers": layers}});
        if let Some(b) = bits {
            c["quantization"] = json!({"group_size": 64, "bits": b});
        }
        c
    }

    fn qwen(bits: u64) -> Value {
        json!({"model_type": "qwen3_5_moe", "text_config": {"num_hidden_layers": 40},
               "quantization": {"group_size": 64, "bits": bits}})
    }

    #[test]
    fn bases_are_inferred_from_model_type_and_depth() {
        let pick =
            |c: &Value| choose(&BaseArg::Infer, "m", c, None, true).map(|b| b.map(|b| b.name));
        assert_eq!(pick(&qwen(6)), Ok(Some("qwen3.6-35b-a3b")));
        assert_eq!(pick(&gemma(48, Some(6))), Ok(Some("gemma-4-12b")));
        assert_eq!(pick(&gemma(60, Some(6))), Ok(Some("gemma-4-31b")));
        assert_eq!(pick(&json!({"model_type": "llama"})), Ok(None));
        let err = pick(&gemma(4, None)).unwrap_err().to_string();
        assert!(
            err.contains("gemma-4-12b") && err.contains("--base custom"),
            "{err}"
        );
    }

    #[test]
    fn refusals_name_what_to_use_instead() {
        let err = choose(&BaseArg::Infer, "m", &qwen(8), None, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("mlx-community/Qwen3.6-35B-A3B-6bit"), "{err}");
        let err = choose(
            &BaseArg::Named("gemma-4-12b".into()),
            "mlx-community/gemma-4-12B-it-4bit",
            &gemma(48, Some(4)),
            None,
            true,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("suite-accuracy") && err.contains("gemma-4-12B-it-6bit"));
        let fp8 = json!({"model_type": "qwen3_5_moe", "num_hidden_layers": 40,
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}});
        let err = choose(
            &BaseArg::Infer,
            "Qwen/Qwen3.6-35B-A3B-FP8",
            &fp8,
            None,
            true,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("FP8") && err.contains("Qwen3.6-35B-A3B-6bit"),
            "{err}"
        );
        // vLLM serves FP8 checkpoints.
        assert!(choose(&BaseArg::Infer, "q", &fp8, None, false).is_ok());
        let err = choose(
            &BaseArg::Checkpoint("Qwen/Qwen3.6-35B-A3B-FP8".into()),
            "m",
            &qwen(6),
            Some(&fp8),
            true,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("--base `Qwen/Qwen3.6-35B-A3B-FP8`"), "{err}");
    }

    #[test]
    fn custom_serves_anything_but_fp8_and_unknown_names_list_the_bases() {
        assert!(matches!(
            choose(&BaseArg::Custom, "m", &gemma(4, None), None, true),
            Ok(None)
        ));
        let err = choose(&BaseArg::Named("gemma-5".into()), "m", &qwen(6), None, true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("qwen3.6-35b-a3b, gemma-4-12b, gemma-4-31b, custom"),
            "{err}"
        );
    }

    #[test]
    fn the_gemma_bases_take_the_references_gemma_prompt_and_qwen_keeps_its_own() {
        // decisio/families.py: GEMMA4 and GEMMA4_31B set system_prompt,
        // answer_slot "template", label_variants "summed" and layout
        // "header"; QWEN keeps the defaults.
        for name in ["gemma-4-12b", "gemma-4-31b"] {
            let f = by_name(name).unwrap().wire.format;
            assert!(f.system_turn, "{name}");
            assert_eq!(f.slot, AnswerSlot::Template, "{name}");
            assert_eq!(f.variants, LabelVariants::Summed, "{name}");
            assert_eq!(f.layout, Layout::Header, "{name}");
            assert!(
                !f.bare_codes(),
                "{name}: summed forms keep the spaced codes"
            );
        }
        let qwen = by_name("qwen3.6-35b-a3b").unwrap().wire;
        assert_eq!(qwen, WireSettings::SERVED);
        assert_eq!(qwen.format, PromptFormat::QWEN);
    }

    #[test]
    fn long_states_warn_only_where_documented() {
        let b31 = by_name("gemma-4-31b").unwrap();
        assert!(long_state_warning(b31, 16_383).is_none());
        assert!(long_state_warning(b31, 16_384).unwrap().contains("16383"));
        assert!(long_state_warning(default_base(), 100_000).is_none());
    }
}
