//! A minimal reader for the GGUF header: the architecture and the tensor
//! descriptors.
//!
//! MLX's loader silently dequantizes tensor types it has no kernel for (the
//! k-quants, for instance) to float16, after which a float16 tensor that was
//! stored as float16 and one that was stored as Q4_K look the same. The
//! converter therefore reads the header itself, before MLX loads anything, to
//! know each tensor's stored type and to refuse the ones it cannot carry over
//! unchanged. Only the header is read; tensor data is never touched here.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek};
use std::path::Path;

/// `GGUF` as a little-endian u32.
const MAGIC: u32 = 0x4655_4747;

/// A ggml tensor type, as stored in the tensor descriptors of a GGUF file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: Self = Self(0);
    pub const F16: Self = Self(1);
    pub const Q4_0: Self = Self(2);
    pub const Q4_1: Self = Self(3);
    pub const Q8_0: Self = Self(8);

    /// The type's name as llama.cpp spells it.
    pub fn name(self) -> String {
        let name = match self.0 {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            other => return format!("type {other}"),
        };
        name.to_owned()
    }

    /// `(group_size, bits)` of the MLX affine quantization MLX loads this
    /// type as, or `None` for a type MLX loads as a plain array.
    pub fn mlx_quantization(self) -> Option<(u32, u32)> {
        match self {
            Self::Q4_0 | Self::Q4_1 => Some((32, 4)),
            Self::Q8_0 => Some((32, 8)),
            _ => None,
        }
    }

    /// Whether MLX loads this type without changing it: as float32 or
    /// float16, or as an MLX quantized triple holding the same numbers.
    pub fn is_carried_over(self) -> bool {
        matches!(
            self,
            Self::F32 | Self::F16 | Self::Q4_0 | Self::Q4_1 | Self::Q8_0
        )
    }
}

/// One tensor descriptor.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

/// What the header holds that the converter needs.
#[derive(Debug, Clone)]
pub struct Header {
    /// `general.architecture`, when stored as a string.
    pub architecture: Option<String>,
    pub tensors: Vec<TensorInfo>,
}

/// Why a header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the file does not start with the GGUF magic bytes")]
    BadMagic,
    #[error("GGUF version {0} is not supported (versions 2 and 3 are)")]
    Version(u32),
    #[error("{0}")]
    Malformed(String),
}

/// Reads the header of the GGUF file at `path`.
pub fn read_header(path: &Path) -> Result<Header, HeaderError> {
    let file = File::open(path)?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    parse(&mut reader)
}

fn parse<R: Read + Seek>(r: &mut R) -> Result<Header, HeaderError> {
    if read_u32(r)? != MAGIC {
        return Err(HeaderError::BadMagic);
    }
    let version = read_u32(r)?;
    if !(2..=3).contains(&version) {
        return Err(HeaderError::Version(version));
    }
    let tensor_count = read_u64(r)?;
    let kv_count = read_u64(r)?;
    let mut architecture = None;
    for _ in 0..kv_count {
        let key = read_string(r)?;
        let value_type = read_u32(r)?;
        if key == "general.architecture" && value_type == 8 {
            architecture = Some(read_string(r)?);
        } else {
            skip_value(r, value_type)?;
        }
    }
    let mut tensors = Vec::new();
    for _ in 0..tensor_count {
        let name = read_string(r)?;
        let n_dims = read_u32(r)?;
        if n_dims > 8 {
            return Err(HeaderError::Malformed(format!(
                "tensor {name:?} claims {n_dims} dimensions"
            )));
        }
        let dims = (0..n_dims)
            .map(|_| read_u64(r))
            .collect::<io::Result<Vec<_>>>()?;
        let ggml_type = GgmlType(read_u32(r)?);
        let _offset = read_u64(r)?;
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
        });
    }
    Ok(Header {
        architecture,
        tensors,
    })
}

fn skip_value<R: Read + Seek>(r: &mut R, value_type: u32) -> Result<(), HeaderError> {
    match value_type {
        // u8, i8, bool
        0 | 1 | 7 => skip(r, 1),
        // u16, i16
        2 | 3 => skip(r, 2),
        // u32, i32, f32
        4..=6 => skip(r, 4),
        // u64, i64, f64
        10..=12 => skip(r, 8),
        8 => {
            let len = read_u64(r)?;
            skip(r, len)
        }
        9 => {
            let element_type = read_u32(r)?;
            let count = read_u64(r)?;
            if element_type == 9 {
                return Err(HeaderError::Malformed(
                    "nested metadata arrays are not supported".into(),
                ));
            }
            match element_size(element_type) {
                Some(size) => skip(r, size.checked_mul(count).ok_or_else(too_large)?),
                None => {
                    for _ in 0..count {
                        skip_value(r, element_type)?;
                    }
                    Ok(())
                }
            }
        }
        other => Err(HeaderError::Malformed(format!(
            "unknown metadata value type {other}"
        ))),
    }
}

fn element_size(value_type: u32) -> Option<u64> {
    match value_type {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn too_large() -> HeaderError {
    HeaderError::Malformed("a metadata value is larger than the file".into())
}

fn skip<R: Read + Seek>(r: &mut R, bytes: u64) -> Result<(), HeaderError> {
    let bytes = i64::try_from(bytes).map_err(|_| too_large())?;
    r.seek_relative(bytes)?;
    Ok(())
}

fn read_u32<R: Read>(r: &mut R) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64<R: Read>(r: &mut R) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_string<R: Read>(r: &mut R) -> Result<String, HeaderError> {
    let len = read_u64(r)?;
    if len > 1 << 20 {
        return Err(HeaderError::Malformed(format!(
            "a key or tensor name claims {len} bytes"
        )));
    }
    let mut bytes = vec![0u8; len as usize];
    r.read_exact(&mut bytes)?;
    String::from_utf8(bytes)
        .map_err(|_| HeaderError::Malformed("a key or tensor name is not UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    #[test]
    fn reads_keys_and_tensor_descriptors() {
        let mut b = Vec::new();
        b.extend(MAGIC.to_le_bytes());
        b.extend(3u32.to_le_bytes());
        b.extend(2u64.to_le_bytes()); // tensors
        b.extend(3u64.to_le_bytes()); // kv
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "llama");
        string(&mut b, "tokenizer.ggml.tokens");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "a");
        string(&mut b, "bc");
        string(&mut b, "tokenizer.ggml.token_type");
        b.extend(9u32.to_le_bytes());
        b.extend(5u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(1i32.to_le_bytes());
        b.extend(3i32.to_le_bytes());
        string(&mut b, "token_embd.weight");
        b.extend(2u32.to_le_bytes());
        b.extend(64u64.to_le_bytes());
        b.extend(10u64.to_le_bytes());
        b.extend(12u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        string(&mut b, "output_norm.weight");
        b.extend(1u32.to_le_bytes());
        b.extend(64u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(4096u64.to_le_bytes());

        let header = parse(&mut Cursor::new(b)).unwrap();
        assert_eq!(header.architecture.as_deref(), Some("llama"));
        assert_eq!(header.tensors.len(), 2);
        assert_eq!(header.tensors[0].name, "token_embd.weight");
        assert_eq!(header.tensors[0].dims, [64, 10]);
        assert_eq!(header.tensors[0].ggml_type.name(), "Q4_K");
        assert!(!header.tensors[0].ggml_type.is_carried_over());
        assert_eq!(header.tensors[1].ggml_type, GgmlType::F32);
    }

    #[test]
    fn rejects_other_files() {
        let err = parse(&mut Cursor::new(b"PK\x03\x04 not a gguf".to_vec())).unwrap_err();
        assert!(matches!(err, HeaderError::BadMagic));
        let mut b = MAGIC.to_le_bytes().to_vec();
        b.extend(1u32.to_le_bytes());
        assert!(matches!(
            parse(&mut Cursor::new(b)).unwrap_err(),
            HeaderError::Version(1)
        ));
    }

    #[test]
    fn quantization_of_types() {
        assert_eq!(GgmlType::Q4_0.mlx_quantization(), Some((32, 4)));
        assert_eq!(GgmlType::Q4_1.mlx_quantization(), Some((32, 4)));
        assert_eq!(GgmlType::Q8_0.mlx_quantization(), Some((32, 8)));
        assert_eq!(GgmlType::F16.mlx_quantization(), None);
        assert_eq!(GgmlType(99).name(), "type 99");
    }
}
