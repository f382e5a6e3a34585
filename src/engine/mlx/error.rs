//! The errors of the MLX backend: a model or configuration it cannot serve,
//! and MLX's own exceptions.

/// Errors of loading or running an MLX model.
#[derive(Debug, thiserror::Error)]
pub enum MlxError {
    #[error("{0}")]
    Config(String),
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}

pub type MlxResult<T> = Result<T, MlxError>;
