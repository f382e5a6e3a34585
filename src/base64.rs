//! The little-endian float32 vectors OpenAI's `encoding_format: "base64"`
//! embeddings carry (standard base64, padding optional when read): the
//! exact bits of each float, where decimal text would need care to
//! round-trip.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;

/// Standard base64; written with padding, read with or without it.
const STANDARD: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Float32 values as base64 of their little-endian bytes.
pub fn encode_f32(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    STANDARD.encode(bytes)
}

/// Float32 values from base64 of their little-endian bytes.
pub fn decode_f32(text: &str) -> Result<Vec<f32>, String> {
    let bytes = STANDARD
        .decode(text)
        .map_err(|e| format!("the embedding is not base64: {e}"))?;
    if bytes.len() % 4 != 0 {
        return Err(format!(
            "{} bytes are not a whole number of float32 values",
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float32_vectors_round_trip_bit_for_bit() {
        let v = [0.0f32, -1.5, f32::MIN_POSITIVE, 3.4e38, 1.0e-7, -0.0];
        let back = decode_f32(&encode_f32(&v)).unwrap();
        assert_eq!(
            back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        // numpy's float32 1.0 little-endian, as Python's base64 writes it,
        // and the same without its padding.
        assert_eq!(encode_f32(&[1.0]), "AACAPw==");
        assert_eq!(decode_f32("AACAPw").unwrap(), vec![1.0]);
        assert!(decode_f32("Zm9v!").is_err());
        assert!(decode_f32("Zm9v").is_err());
    }
}
