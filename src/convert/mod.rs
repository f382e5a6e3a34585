//! GGUF checkpoints to MLX conversion folders (`decisio convert`).
//!
//! decisio serves models from folders in Hugging Face's layout, the layout
//! mlx-lm reads: `config.json`, `model.safetensors`, `tokenizer.json`,
//! `tokenizer_config.json` and `generation_config.json`. Many small chat
//! models are published only as llama.cpp GGUF files; this module turns such
//! a file into such a folder without a Python toolchain.
//!
//! What is carried over, and how:
//! - Weights keep their stored precision. MLX loads Q4_0/Q4_1/Q8_0 tensors
//!   as affine-quantized triples (group size 32) holding the GGUF's exact
//!   numbers, and F32/F16 tensors as they are; they are renamed to Hugging
//!   Face names and written as they were loaded. Other tensor types (k-quants
//!   and friends) are refused: MLX would silently dequantize them.
//!   `--weights dense` dequantizes every quantized matrix to float32 (a
//!   reference for the gates), `--weights q2`..`q8` quantizes it again at
//!   other bits (a candidate, or a deliberately degraded one).
//! - The query and key projections are un-permuted. llama.cpp reorders their
//!   rows for interleaved ("traditional") rope; the folder has the original
//!   row order and uses ordinary rope, like every Hugging Face llama.
//! - `config.json` states the quantization the way mlx-lm does: the
//!   parameters most modules share, plus an entry for each module that
//!   differs (typically an 8-bit embedding in a 4-bit model).
//! - The tokenizer is rebuilt from the GGUF vocabulary, merges and token
//!   types with the `tokenizers` crate.
//!
//! Only the llama architecture with byte-level BPE vocabularies is handled;
//! anything else is refused with an error that says what to do instead.
//! The folder is written next to its destination and renamed into place
//! when complete.

mod folder;
mod header;
mod llama;
mod meta;
mod quant;
mod tensors;
mod tokenizer;

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use mlx_rs::io::{GgufError, GgufFile};
use mlx_rs::Array;
use serde_json::Value;

pub use llama::LlamaParams;
pub use quant::{QuantConfig, QuantParams};
pub use tensors::unpermute_rows;
pub use tokenizer::KNOWN_PRE_TOKENIZERS;

/// Tensor types MLX loads without changing their numbers.
pub const CARRIED_TENSOR_TYPES: &[&str] = &["F32", "F16", "Q4_0", "Q4_1", "Q8_0"];

/// The files of a conversion folder.
pub const OUTPUT_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// Why a conversion failed. Each message says what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    #[error("cannot read {path}: {error}; check the --gguf path")]
    Input { path: PathBuf, error: io::Error },

    #[error("{path} is not a GGUF file that can be converted ({reason}); pass a .gguf checkpoint written by llama.cpp")]
    NotGguf { path: PathBuf, reason: String },

    #[error("MLX could not load {path}: {error}; the file may be truncated or damaged, download it again")]
    Load { path: PathBuf, error: GgufError },

    #[error("the GGUF architecture is {architecture:?}, but only \"llama\" checkpoints can be converted; for other models, convert the original Hugging Face checkpoint with mlx_lm.convert")]
    UnsupportedArchitecture { architecture: String },

    #[error("tensor {tensor} is stored as {ggml_type}{more}, which MLX cannot load without dequantizing; use a GGUF quantized as Q4_0, Q4_1 or Q8_0 (or F16/F32), for instance re-quantize with llama-quantize")]
    UnsupportedTensorType {
        tensor: String,
        ggml_type: String,
        /// ", and N more tensors" when there are others.
        more: String,
    },

    #[error("the GGUF has no {key:?} metadata, which a llama conversion needs; the file is incomplete or was not written by llama.cpp's converter")]
    MissingMetadata { key: String },

    #[error("GGUF metadata {key:?} is unusable: {reason}; the file was probably not written by llama.cpp's converter")]
    BadMetadata { key: String, reason: String },

    #[error("this GGUF uses {feature}, which the llama conversion does not support; convert the original Hugging Face checkpoint with mlx_lm.convert instead")]
    Unsupported { feature: String },

    #[error("tensor {tensor} has no place in a Hugging Face llama checkpoint; this GGUF is a llama variant that cannot be converted, use mlx_lm.convert on the original checkpoint")]
    UnexpectedTensor { tensor: String },

    #[error("the GGUF lacks tensor {tensor}; the file is incomplete, download it again")]
    MissingTensor { tensor: String },

    #[error("tensor {tensor} has shape {found:?} where the metadata implies {expected:?}; the GGUF's metadata and tensors disagree")]
    Shape {
        tensor: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },

    #[error("tokenizer.ggml.model is {model:?}; only byte-level BPE vocabularies (\"gpt2\") can be rebuilt as tokenizer.json, use a checkpoint whose Hugging Face tokenizer.json is available instead")]
    UnsupportedTokenizer { model: String },

    #[error("tokenizer.ggml.pre is {pre:?}, whose splitting rules are not known (known: \"smollm\", \"gpt2\", \"default\"); add them to src/convert/tokenizer.rs to convert this GGUF")]
    UnsupportedPreTokenizer { pre: String },

    #[error("could not build the tokenizer: {0}")]
    Tokenizer(String),

    #[error("{path} already exists and is not empty; pass --force to replace it, or choose another --out")]
    OutputExists { path: PathBuf },

    #[error("the GGUF file lies inside the output folder {out}; choose an --out that does not contain it")]
    InputInsideOutput { out: PathBuf },

    #[error(
        "cannot write {path}: {error}; check that the folder is writable and the disk has room"
    )]
    Output { path: PathBuf, error: io::Error },

    #[error(
        "cannot write {path}: {error}; check that the folder is writable and the disk has room"
    )]
    Save {
        path: PathBuf,
        error: mlx_rs::error::IoError,
    },

    #[error("MLX failed while {action}: {}", error.what())]
    Mlx {
        action: &'static str,
        error: mlx_rs::error::Exception,
    },
}

/// How to convert.
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// Replace an existing, non-empty output folder.
    pub force: bool,
    /// The dtype of every floating-point array written (quantization scales
    /// and biases, norms, dense weights); `None` keeps the GGUF's.
    pub float_dtype: Option<FloatDtype>,
    /// What becomes of the GGUF's quantized matrices.
    pub weights: Weights,
}

/// What a conversion does with the checkpoint's quantized matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weights {
    /// Carried as they are (the default).
    #[default]
    Keep,
    /// Dequantized to float32 matrices: the same values, no quantization
    /// (a reference to compare conversions against).
    Dense,
    /// Dequantized and quantized again at these bits (2, 3, 4, 5, 6 or 8),
    /// with the same group size.
    Bits(u32),
}

impl std::str::FromStr for Weights {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "keep" => Ok(Weights::Keep),
            "dense" => Ok(Weights::Dense),
            _ => match s.strip_prefix('q').and_then(|b| b.parse::<u32>().ok()) {
                Some(b @ (2 | 3 | 4 | 5 | 6 | 8)) => Ok(Weights::Bits(b)),
                _ => Err(format!(
                    "`{s}` is not keep, dense, q2, q3, q4, q5, q6 or q8"
                )),
            },
        }
    }
}

/// Floating-point dtypes a conversion can store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FloatDtype {
    Float32,
    Float16,
    Bfloat16,
}

impl FloatDtype {
    pub fn mlx(self) -> mlx_rs::Dtype {
        match self {
            FloatDtype::Float32 => mlx_rs::Dtype::Float32,
            FloatDtype::Float16 => mlx_rs::Dtype::Float16,
            FloatDtype::Bfloat16 => mlx_rs::Dtype::Bfloat16,
        }
    }
}

/// What a conversion wrote.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    pub gguf: PathBuf,
    pub out: PathBuf,
    pub architecture: String,
    pub params: LlamaParams,
    /// Arrays in `model.safetensors` (a quantized module counts three).
    pub tensors: usize,
    /// Size of `model.safetensors`.
    pub safetensors_bytes: u64,
    /// `None` when no tensor is quantized.
    pub quantization: Option<QuantConfig>,
    /// True when the GGUF has no `output.weight`.
    pub tie_word_embeddings: bool,
    /// File names in the folder.
    pub files: Vec<String>,
}

impl fmt::Display for ConvertReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "converted {} ({}, {} layers, vocabulary {}) into {}",
            self.gguf.display(),
            self.architecture,
            self.params.num_hidden_layers,
            self.params.vocab_size,
            self.out.display()
        )?;
        writeln!(
            f,
            "  model.safetensors: {} tensors, {:.1} MB{}",
            self.tensors,
            self.safetensors_bytes as f64 / 1e6,
            if self.tie_word_embeddings {
                ", embeddings tied to the output"
            } else {
                ""
            }
        )?;
        match &self.quantization {
            Some(q) => writeln!(f, "  quantization: {q}")?,
            None => writeln!(f, "  quantization: none")?,
        }
        write!(f, "  files: {}", self.files.join(", "))
    }
}

/// Converts the GGUF file `gguf` into a conversion folder at `out`, which
/// must not exist or be empty (see [`convert_gguf_with`] to replace it).
pub fn convert_gguf(gguf: &Path, out: &Path) -> Result<ConvertReport, ConvertError> {
    convert_gguf_with(gguf, out, &ConvertOptions::default())
}

/// [`convert_gguf`] with options.
pub fn convert_gguf_with(
    gguf: &Path,
    out: &Path,
    options: &ConvertOptions,
) -> Result<ConvertReport, ConvertError> {
    let input_error = |error| ConvertError::Input {
        path: gguf.to_owned(),
        error,
    };
    let not_gguf = |reason: String| ConvertError::NotGguf {
        path: gguf.to_owned(),
        reason,
    };
    let stat = fs::metadata(gguf).map_err(input_error)?;
    if !stat.is_file() {
        return Err(input_error(io::Error::other("not a file")));
    }
    if gguf.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return Err(not_gguf(
            "its name does not end in .gguf, which MLX requires; rename it".into(),
        ));
    }
    let header = header::read_header(gguf).map_err(|e| match e {
        header::HeaderError::Io(error) => input_error(error),
        other => not_gguf(other.to_string()),
    })?;

    let architecture = header
        .architecture
        .clone()
        .ok_or_else(|| meta::missing("general.architecture"))?;
    if architecture != llama::ARCHITECTURE {
        return Err(ConvertError::UnsupportedArchitecture { architecture });
    }
    check_tensor_types(&header)?;
    refuse_input_inside_output(gguf, out)?;

    let staging = folder::Staging::new(out, options.force)?;

    let file = GgufFile::load(gguf).map_err(|error| ConvertError::Load {
        path: gguf.to_owned(),
        error,
    })?;
    let meta = meta::Meta::new(&file);
    let params = LlamaParams::read(&meta, &header)?;
    let tok = tokenizer::build(&meta, params.max_position_embeddings, params.vocab_size)?;
    let converted = tensors::convert(
        &file,
        &header,
        &params,
        options.float_dtype,
        options.weights,
    )?;
    let quantization = QuantConfig::from_modules(&converted.quantized);
    let tie_word_embeddings = !converted.has_lm_head;

    let dir = staging.dir().to_owned();
    write_json(
        &dir.join("config.json"),
        &params.config_json(
            tie_word_embeddings,
            tok.bos_token_id,
            tok.eos_token_id,
            quantization.as_ref(),
        ),
    )?;
    write_json(
        &dir.join("generation_config.json"),
        &llama::generation_config_json(tok.bos_token_id, tok.eos_token_id),
    )?;
    write_json(&dir.join("tokenizer_config.json"), &tok.tokenizer_config)?;
    let tokenizer_path = dir.join("tokenizer.json");
    tok.tokenizer
        .save(&tokenizer_path, true)
        .map_err(|e| ConvertError::Tokenizer(format!("writing tokenizer.json: {e}")))?;

    let safetensors_path = dir.join("model.safetensors");
    let metadata = HashMap::from([("format".to_owned(), "mlx".to_owned())]);
    Array::save_safetensors(converted.arrays.iter(), &metadata, &safetensors_path).map_err(
        |error| ConvertError::Save {
            path: safetensors_path.clone(),
            error,
        },
    )?;
    let safetensors_bytes = fs::metadata(&safetensors_path)
        .map_err(|error| ConvertError::Output {
            path: safetensors_path.clone(),
            error,
        })?
        .len();
    let mut files: Vec<String> = fs::read_dir(&dir)
        .map_err(|error| ConvertError::Output {
            path: dir.clone(),
            error,
        })?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();

    staging.commit()?;
    Ok(ConvertReport {
        gguf: gguf.to_owned(),
        out: out.to_owned(),
        architecture,
        params,
        tensors: converted.arrays.len(),
        safetensors_bytes,
        quantization,
        tie_word_embeddings,
        files,
    })
}

fn check_tensor_types(header: &header::Header) -> Result<(), ConvertError> {
    let mut bad = header
        .tensors
        .iter()
        .filter(|t| !t.ggml_type.is_carried_over());
    if let Some(first) = bad.next() {
        let others = bad.count();
        return Err(ConvertError::UnsupportedTensorType {
            tensor: first.name.clone(),
            ggml_type: first.ggml_type.name(),
            more: match others {
                0 => String::new(),
                n => format!(
                    ", and {n} more tensors are not {}",
                    CARRIED_TENSOR_TYPES.join("/")
                ),
            },
        });
    }
    Ok(())
}

/// With `--force` the old output folder is deleted: never let that be the
/// folder the input lives in.
fn refuse_input_inside_output(gguf: &Path, out: &Path) -> Result<(), ConvertError> {
    if let (Ok(gguf), Ok(out_abs)) = (gguf.canonicalize(), out.canonicalize()) {
        if gguf.starts_with(&out_abs) {
            return Err(ConvertError::InputInsideOutput {
                out: out.to_owned(),
            });
        }
    }
    Ok(())
}

fn write_json(path: &Path, value: &Value) -> Result<(), ConvertError> {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values always serialize");
    text.push('\n');
    fs::write(path, text).map_err(|error| ConvertError::Output {
        path: path.to_owned(),
        error,
    })
}

/// Arguments of `decisio convert`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConvertArgs {
    /// GGUF checkpoint to convert (llama architecture; F32, F16, Q4_0, Q4_1
    /// or Q8_0 tensors; byte-level BPE vocabulary).
    #[arg(long, value_name = "PATH")]
    pub gguf: PathBuf,

    /// Folder to write the conversion into. It must not exist or be empty,
    /// unless --force is given.
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,

    /// Replace the output folder if it already exists.
    #[arg(long)]
    pub force: bool,

    /// Dtype of the floating-point arrays (quantization scales and biases,
    /// norms). MLX computes in the dtype of the scales, and its CPU backend
    /// multiplies half-precision quantized matrices about 35 times slower
    /// than float32 ones (runs/2026-11-30_cpu-kernels), so float32 is the
    /// default; use `keep` for the GGUF's own (float16 scales), e.g. on Metal.
    #[arg(long, value_enum, default_value = "float32")]
    pub dtype: DtypeArg,

    /// The quantized matrices: `keep` them as stored, make them `dense`
    /// (float32, the same values), or quantize them again at `q2`..`q8`
    /// bits. `dense` gives a reference to gate a conversion against; `q2`
    /// or `q3` a deliberately degraded one (docs/gates.md).
    #[arg(long, default_value = "keep")]
    pub weights: Weights,
}

/// `--dtype` of `decisio convert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DtypeArg {
    Keep,
    Float32,
    Float16,
    Bfloat16,
}

/// Runs `decisio convert` and prints a short report.
pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    let float_dtype = match args.dtype {
        DtypeArg::Keep => None,
        DtypeArg::Float32 => Some(FloatDtype::Float32),
        DtypeArg::Float16 => Some(FloatDtype::Float16),
        DtypeArg::Bfloat16 => Some(FloatDtype::Bfloat16),
    };
    let options = ConvertOptions {
        force: args.force,
        float_dtype,
        weights: args.weights,
    };
    let report = convert_gguf_with(&args.gguf, &args.out, &options)?;
    println!("{report}");
    Ok(())
}
