//! Python semantics that chat templates rely on.
//!
//! Hugging Face chat templates are written for Python's jinja2, so what they
//! print follows Python: `str(None)` is `None`, `str([1, 'a'])` is
//! `[1, 'a']`, `str.strip()` strips Python's whitespace set, `tojson` is
//! `json.dumps`. MiniJinja follows Rust conventions instead; the helpers here
//! restore Python's behaviour where it changes the rendered bytes.
//!
//! - `repr.rs`: `str()` and `repr()` of values, tuples, floats and strings.
//! - `strings.rs`: string methods (`strip`, `split`, `splitlines`, ...).
//! - `format.rs`: `%` formatting and `str.format`.
//! - `json.rs`: `json.dumps`.
//! - `time.rs`: `strftime` in the C locale.

mod format;
mod json;
mod repr;
mod strings;
mod time;

pub use format::{percent_format, str_format};
pub use json::{json_dumps, JsonOptions};
pub use repr::{into_tuples, py_str};
pub use strings::{center, indent, is_lower, is_upper, split, splitlines, strip, wordcount};
pub use time::{strftime, CivilTime};
