//! Request fields as every route reads and checks them: JSON's optional
//! booleans and integers (read leniently, as vLLM's pydantic models read
//! them), and the range and shape checks that several routes share. Each
//! check's error names the field and says what is accepted.

use serde::Deserialize;

use super::error::ApiError;

/// OpenAI's schemas allow `null` for optional booleans: read it as `false`.
pub fn null_is_false<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

/// A boolean that may be `null` (read as `false`), remembering that it
/// was sent.
pub fn present_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(Some(Option::<bool>::deserialize(d)?.unwrap_or(false)))
}

/// Integers as JSON Schema and vLLM's request models (pydantic, lax mode)
/// read them: `3` and `3.0` are the integer 3; `3.5` is refused. Used with
/// `deserialize_with` on every integer field of a request.
pub mod int {
    use serde::de::{self, Deserializer, Visitor};
    use serde::Deserialize;

    struct Int(i64);

    impl<'de> Deserialize<'de> for Int {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct IntVisitor;
            impl Visitor<'_> for IntVisitor {
                type Value = Int;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an integer")
                }
                fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                    Ok(Int(v))
                }
                fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                    i64::try_from(v)
                        .map(Int)
                        .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
                }
                fn visit_f64<E: de::Error>(self, v: f64) -> Result<Int, E> {
                    // Only where every integer is a float: an integer
                    // literal beyond i64 also arrives here, rounded.
                    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
                    if v.fract() == 0.0 && v.abs() <= EXACT {
                        Ok(Int(v as i64))
                    } else {
                        Err(E::invalid_value(de::Unexpected::Float(v), &self))
                    }
                }
            }
            d.deserialize_any(IntVisitor)
        }
    }

    pub fn opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        Ok(Option::<Int>::deserialize(d)?.map(|i| i.0))
    }

    pub fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<i64>, D::Error> {
        Ok(Vec::<Int>::deserialize(d)?
            .into_iter()
            .map(|i| i.0)
            .collect())
    }

    pub fn opt_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<i64>>, D::Error> {
        Ok(Option::<Vec<Int>>::deserialize(d)?.map(|l| l.into_iter().map(|i| i.0).collect()))
    }

    pub fn lists<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<i64>>, D::Error> {
        Ok(Vec::<Vec<Int>>::deserialize(d)?
            .into_iter()
            .map(|l| l.into_iter().map(|i| i.0).collect())
            .collect())
    }
}

pub fn int_in(value: i64, lo: i64, hi: i64, param: &str) -> Result<i64, ApiError> {
    if value < lo || value > hi {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be between {lo} and {hi}; got {value}"),
        ));
    }
    Ok(value)
}

/// Features the server does not implement are refused rather than ignored.
pub fn unsupported<T>(value: &Option<T>, param: &str, why: &str) -> Result<(), ApiError> {
    if value.is_some() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` is not supported: {why}"),
        ));
    }
    Ok(())
}

/// Token ids as sent (checked against the vocabulary later).
pub fn token_ids(ids: &[i64], param: &str) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .map(|&id| {
            u32::try_from(id).map_err(|_| {
                ApiError::invalid(param, format!("token ids must be non-negative; got {id}"))
            })
        })
        .collect()
}

/// A task's name (or an abstention task's id, `what`): 1 to the limit's
/// characters of A-Z, a-z, 0-9, `-`, `_` and `.`, else a 400 naming
/// `param`.
pub fn task_name(
    name: &str,
    param: &str,
    what: &str,
    limits: &crate::settings::Limits,
) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= limits.max_task_name_bytes
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        return Ok(());
    }
    Err(ApiError::invalid(
        param,
        format!(
            "{what} is 1 to {} characters of A-Z, a-z, 0-9, `-`, `_` and `.`; got `{name}`",
            limits.max_task_name_bytes
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::types::{
        ChatCompletionRequest, CompletionRequest, DetokenizeRequest, PromptSpec,
    };

    fn detok(body: &str) -> Result<Vec<i64>, String> {
        serde_json::from_str::<DetokenizeRequest>(body)
            .map(|r| r.tokens)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn integers_may_be_written_without_a_fraction() {
        assert_eq!(detok(r#"{"tokens": [1, 2.0, -3.0]}"#).unwrap(), [1, 2, -3]);
        assert_eq!(
            detok(r#"{"tokens": [-9223372036854775808]}"#).unwrap(),
            [i64::MIN]
        );
        // A fraction, or an integer literal beyond i64 (read as a rounded
        // float), is refused.
        assert!(detok(r#"{"tokens": [2.5]}"#).is_err());
        assert!(detok(r#"{"tokens": [-9223372036854775809]}"#).is_err());
        assert!(detok(r#"{"tokens": [18446744073709551616]}"#).is_err());
        assert!(detok(r#"{"tokens": [1e300]}"#).is_err());
        let req: ChatCompletionRequest =
            serde_json::from_str(r#"{"messages": [], "max_tokens": 16.0, "seed": null}"#).unwrap();
        assert_eq!((req.max_tokens, req.seed), (Some(16), None));
        let req: CompletionRequest = serde_json::from_str(r#"{"prompt": [[5.0, 6]]}"#).unwrap();
        assert!(matches!(req.prompt, PromptSpec::TokensBatch(ref v) if v == &[vec![5, 6]]));
    }
}
