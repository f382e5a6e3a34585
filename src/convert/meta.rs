//! Typed access to GGUF metadata as MLX loads it.
//!
//! MLX hands scalars back as zero-dimensional arrays of the stored type, and
//! strings and string lists as text. These helpers turn them into plain Rust
//! values and turn a missing or ill-typed key into a [`ConvertError`] that
//! names the key.

use mlx_rs::io::{GgufError, GgufFile};
use mlx_rs::{Array, Dtype};

use super::ConvertError;

/// A borrowed view of a loaded GGUF file's metadata.
pub(crate) struct Meta<'a> {
    file: &'a GgufFile,
}

impl<'a> Meta<'a> {
    pub fn new(file: &'a GgufFile) -> Self {
        Self { file }
    }

    pub fn string(&self, key: &str) -> Result<Option<String>, ConvertError> {
        self.file
            .get_metadata_string(key)
            .map_err(|e| bad_kind(key, e))
    }

    pub fn strings(&self, key: &str) -> Result<Option<Vec<String>>, ConvertError> {
        self.file
            .get_metadata_strings(key)
            .map_err(|e| bad_kind(key, e))
    }

    fn array(&self, key: &str) -> Result<Option<Array>, ConvertError> {
        self.file
            .get_metadata_array(key)
            .map_err(|e| bad_kind(key, e))
    }

    fn scalar(&self, key: &str) -> Result<Option<Array>, ConvertError> {
        match self.array(key)? {
            Some(a) if a.size() == 1 => Ok(Some(a)),
            Some(a) => Err(bad(
                key,
                format!("expected one value, found {} (per-layer values?)", a.size()),
            )),
            None => Ok(None),
        }
    }

    /// A non-negative integer.
    pub fn uint(&self, key: &str) -> Result<Option<u64>, ConvertError> {
        let Some(a) = self.scalar(key)? else {
            return Ok(None);
        };
        let value = match a.dtype() {
            Dtype::Uint8 | Dtype::Uint16 | Dtype::Uint32 | Dtype::Uint64 => {
                a.try_item_cast::<u64>().map_err(|e| bad(key, e))?
            }
            Dtype::Int8 | Dtype::Int16 | Dtype::Int32 | Dtype::Int64 => {
                let v = a.try_item_cast::<i64>().map_err(|e| bad(key, e))?;
                u64::try_from(v).map_err(|_| bad(key, format!("negative value {v}")))?
            }
            other => return Err(bad(key, format!("expected an integer, found {other:?}"))),
        };
        Ok(Some(value))
    }

    /// A non-negative integer that fits in `u32`.
    pub fn u32(&self, key: &str) -> Result<Option<u32>, ConvertError> {
        self.uint(key)?
            .map(|v| u32::try_from(v).map_err(|_| bad(key, format!("{v} is too large"))))
            .transpose()
    }

    pub fn require_u32(&self, key: &str) -> Result<u32, ConvertError> {
        self.u32(key)?.ok_or_else(|| missing(key))
    }

    /// A float. A float32 value is returned as the shortest decimal that
    /// reads back as the same float32 (so a stored `1e-5f32` is `1e-5`, not
    /// `9.999999747378752e-6`); a float64 value is returned as stored.
    pub fn float(&self, key: &str) -> Result<Option<f64>, ConvertError> {
        let Some(a) = self.scalar(key)? else {
            return Ok(None);
        };
        let value = match a.dtype() {
            Dtype::Float64 => a.try_item_exact::<f64>().map_err(|e| bad(key, e))?,
            Dtype::Float32 => f32_as_decimal(a.try_item_exact::<f32>().map_err(|e| bad(key, e))?),
            other => return Err(bad(key, format!("expected a float, found {other:?}"))),
        };
        Ok(Some(value))
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ConvertError> {
        let Some(a) = self.scalar(key)? else {
            return Ok(None);
        };
        match a.dtype() {
            Dtype::Bool => a
                .try_item_exact::<bool>()
                .map(Some)
                .map_err(|e| bad(key, e)),
            other => Err(bad(key, format!("expected a boolean, found {other:?}"))),
        }
    }

    /// A list of integers (for instance `tokenizer.ggml.token_type`).
    pub fn i32s(&self, key: &str) -> Result<Option<Vec<i32>>, ConvertError> {
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        let a = match a.dtype() {
            Dtype::Int32 => a,
            Dtype::Int8 | Dtype::Int16 | Dtype::Uint8 | Dtype::Uint16 | Dtype::Uint32 => {
                a.as_type::<i32>().map_err(|e| bad(key, e))?
            }
            other => {
                return Err(bad(
                    key,
                    format!("expected 32-bit integers, found {other:?}"),
                ))
            }
        };
        let values = a.try_as_slice::<i32>().map_err(|e| bad(key, e))?.to_vec();
        Ok(Some(values))
    }
}

/// The shortest decimal that reads back as `value`, as an f64.
pub(crate) fn f32_as_decimal(value: f32) -> f64 {
    // `Display` for f32 prints the shortest round-tripping decimal.
    value.to_string().parse::<f64>().unwrap_or(f64::from(value))
}

pub(crate) fn missing(key: &str) -> ConvertError {
    ConvertError::MissingMetadata {
        key: key.to_owned(),
    }
}

pub(crate) fn bad(key: &str, reason: impl ToString) -> ConvertError {
    ConvertError::BadMetadata {
        key: key.to_owned(),
        reason: reason.to_string(),
    }
}

fn bad_kind(key: &str, error: GgufError) -> ConvertError {
    match error {
        GgufError::WrongMetadataKind {
            expected, actual, ..
        } => bad(
            key,
            format!("stored as {actual:?}, expected {expected:?}").to_lowercase(),
        ),
        other => bad(key, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_values_print_as_their_shortest_decimal() {
        assert_eq!(f32_as_decimal(1e-5), 1e-5);
        assert_eq!(f32_as_decimal(1e-6), 1e-6);
        assert_eq!(f32_as_decimal(100000.0), 100000.0);
        assert_eq!(f32_as_decimal(500000.0), 500000.0);
        let odd = f32::from_bits(0x3727_c5ad); // close to 1e-5, but not the nearest
        assert_eq!(f32_as_decimal(odd) as f32, odd);
    }

    #[test]
    fn typed_getters_read_what_mlx_stores() {
        let mut file = GgufFile::new().unwrap();
        file.insert_metadata("u", Array::from_slice(&[30u32], &[1]))
            .unwrap();
        file.insert_metadata("f", Array::from_f32(1e-5)).unwrap();
        file.insert_metadata("b", Array::from_bool(true)).unwrap();
        file.insert_metadata("s", "llama").unwrap();
        file.insert_metadata("l", Array::from_slice(&[1i32, 3, 4], &[3]))
            .unwrap();
        let meta = Meta::new(&file);
        assert_eq!(meta.u32("u").unwrap(), Some(30));
        assert_eq!(meta.float("f").unwrap(), Some(1e-5));
        assert_eq!(meta.boolean("b").unwrap(), Some(true));
        assert_eq!(meta.string("s").unwrap().as_deref(), Some("llama"));
        assert_eq!(meta.i32s("l").unwrap(), Some(vec![1, 3, 4]));
        assert_eq!(meta.u32("absent").unwrap(), None);
        assert!(matches!(
            meta.require_u32("absent"),
            Err(ConvertError::MissingMetadata { .. })
        ));
        assert!(matches!(
            meta.u32("l"),
            Err(ConvertError::BadMetadata { .. })
        ));
        assert!(matches!(
            meta.string("u"),
            Err(ConvertError::BadMetadata { .. })
        ));
    }
}
