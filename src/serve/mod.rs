//! `decisio serve`: its flags, and the start of a server from them: the
//! base, conversion and tokenizer chosen, the chat template and stop tokens
//! read, the engine started (MLX, or vLLM upstreams), the text route and the
//! task registry built over it, and the HTTP server run.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

use crate::bases::{
    self, AnswerSlot, Base, BaseArg, BaseError, LabelVariants, Layout, NoulRendering, WireSettings,
};
use crate::engine::mlx::{Device, LoadOptions, MlxEngine, MlxOptions};
use crate::engine::vllm::{MethodChoice, VllmEngine, VllmOptions};
use crate::engine::{Engine, EngineStatus, MultiQuestion};
use crate::http::{self, AppState};
use crate::hub::{self, Wanted};
use crate::metrics::Metrics;
use crate::model_config;
use crate::prompt::{ChatTemplate, TextTokenizer};
use crate::settings::{Limits, UpstreamLimits};
use crate::tasks::{TaskLimits, TaskRegistry};
use crate::text_route::{PadPolicy, RouteConfig, TextRoute};

mod task_store;
mod upstream;
use upstream::{upstream_model, UpstreamArgs};

#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    /// A local MLX conversion (Metal on macOS, the CPU elsewhere).
    Mlx,
    /// One or more vLLM servers (`--upstream`), sent token-id prompts.
    Vllm,
}

#[derive(Clone, Copy, ValueEnum)]
enum PadArg {
    /// Front-pad each state with newlines to a multiple of --pad-block
    /// tokens.
    Block,
    /// Do not pad.
    None,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Warm,
    Sequential,
}

#[derive(Clone, Copy, ValueEnum)]
enum MethodArg {
    /// The best the upstream honours: logprob_token_ids, else
    /// allowed_token_ids, else top-k with echo requests.
    Auto,
    TokenIds,
    AllowedTokens,
    TopK,
}

#[derive(Clone, Copy, ValueEnum)]
enum Switch {
    Auto,
    On,
    Off,
}

impl Switch {
    /// On or off, with `auto` meaning `default`.
    fn or(self, default: bool) -> bool {
        match self {
            Switch::Auto => default,
            Switch::On => true,
            Switch::Off => false,
        }
    }
}

/// `--dequantize` and `--host-kernels`, `auto` following the device MLX
/// computes on (logged).
fn load_options(dequantize: Switch, host_kernels: Switch) -> LoadOptions {
    let device = Device::current();
    let auto = LoadOptions::for_device(device);
    let load = LoadOptions {
        dequantize: dequantize.or(auto.dequantize),
        host_kernels: host_kernels.or(auto.host_kernels),
        ..auto
    };
    tracing::info!(
        device = device.name(),
        dequantize = load.dequantize,
        host_kernels = load.host_kernels,
        "MLX computes on the {}",
        device.name()
    );
    load
}

/// The arguments of `decisio serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// The backend that runs the model.
    #[arg(long, value_enum, default_value = "mlx")]
    backend: Backend,
    /// The base whose settings apply: a name (`decisio serve --help` lists
    /// them; `custom` for a model outside the bases), or a repository whose
    /// config.json says which base it is. Default: inferred from the
    /// conversion's config.json.
    #[arg(long)]
    base: Option<String>,
    /// The MLX conversion: a local folder, or a Hugging Face repository
    /// `org/name[@revision]` (taken from the Hugging Face cache, downloaded
    /// when missing; default: the base's default conversion). With
    /// `--backend vllm`: the model whose tokenizer, chat template and
    /// config.json build the prompts.
    #[arg(long)]
    model: Option<String>,
    /// A folder or a repository `org/name[@revision]` with tokenizer.json
    /// and tokenizer_config.json to build prompts with (default: the base's
    /// official tokenizer, else the
    /// model's own).
    #[arg(long)]
    tokenizer: Option<String>,
    /// LoRA adapters are not served: refused with what to do instead.
    #[arg(long, hide = true)]
    lora: Vec<String>,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port to listen on; 0 takes a free one that the system chooses.
    /// Either way the server logs `listening on http://ADDR` once the port
    /// is bound, with the port it really has.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The model name clients send (default: the --model argument).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Answers of certified tasks carry the reference decisio's own field
    /// names, `certified`, `certificate` and `certified_reason`, for
    /// clients written against it (default: `x_certified`, `x_certificate`
    /// and `x_certified_reason`, prefixed as System One asks of
    /// extensions).
    #[arg(long)]
    reference_field_names: bool,
    /// /v1/systemone: how a yes/no question is asked (default: the base's;
    /// the Gemma bases: letters, otherwise letters-keys).
    #[arg(long, value_enum)]
    noul_rendering: Option<NoulRendering>,
    /// /v1/systemone: a system turn before each question (default: the
    /// base's; the Gemma bases: true, otherwise false).
    #[arg(long)]
    system_prompt: Option<bool>,
    /// /v1/systemone: where the answer is read (default: the base's; the
    /// Gemma bases: template, otherwise prefill).
    #[arg(long, value_enum)]
    answer_slot: Option<AnswerSlot>,
    /// /v1/systemone: the tokens a label is read from (default: the base's;
    /// the Gemma bases: summed, otherwise single).
    #[arg(long, value_enum)]
    label_variants: Option<LabelVariants>,
    /// /v1/systemone: the user turn's layout (default: the base's; the
    /// Gemma bases: header, otherwise plain). A state read under the header
    /// is not reused for another set of questions: a client that asks a
    /// series of questions about one state wants plain.
    #[arg(long, value_enum)]
    layout: Option<Layout>,
    /// Require `Authorization: Bearer <key>` on every route but /health and /metrics.
    #[arg(long, env = "DECISIO_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Largest top_logprobs (chat) or logprobs (completions).
    #[arg(long, default_value_t = Limits::default().max_logprobs)]
    max_logprobs: usize,
    /// Tokens of context the server offers (prompt and generation
    /// together), when fewer than the model's `max_position_embeddings`;
    /// as vLLM's flag of the same name. Bounds every generation's length.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..))]
    max_model_len: Option<usize>,
    /// What a System One request whose state does not fit the prompt
    /// ceiling beside its questions gets, when it does not say
    /// (`over_limit`): `refuse`d (413, naming its tokens), or its state
    /// `truncate`d to its start, reported in the response and never
    /// certified.
    #[arg(long, value_enum, default_value = "refuse")]
    over_limit: crate::text_route::over_limit::OverLimit,
    /// The prompt ceiling, in tokens, a state is cut to under
    /// `truncate` (default: the context less the one token read).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(64..))]
    over_limit_tokens: Option<usize>,
    /// System One, the header layout: a request whose rows would be over
    /// the prompt ceiling because the header lists every question's
    /// instructions lists only the questions that fit, in the request's
    /// order (none: the plain layout's row), and says so. `auto`: the limit
    /// is the ceiling; a number: also at most that many tokens of header;
    /// `off`: such a row is refused.
    #[arg(long, default_value = "auto", value_parser = crate::settings::HeaderLimit::parse)]
    header_limit: crate::settings::HeaderLimit,
    /// System One: think when unsure. A question whose served confidence
    /// is below its type's threshold (choice 0.75, yes/no 0.92, score 0.70,
    /// times --think-factor), of at most 16 options and of no registered
    /// task, is read again after the model has written up to
    /// --think-budget tokens of reasoning; the two reads are mixed. Off by
    /// default; a request's `think` field decides for that request.
    #[arg(long)]
    think: bool,
    /// The factor on the think thresholds (above 0, at most 1.5): a lower
    /// one thinks on fewer questions.
    #[arg(long, default_value_t = 1.0, value_parser = think_factor)]
    think_factor: f64,
    /// The most tokens of reasoning one question writes (16 to 4096).
    #[arg(long, default_value_t = 512, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(16..=4096))]
    think_budget: usize,
    /// The question types that may think, comma separated (default: all).
    #[arg(long, default_value = "choice,noul,score", value_parser = crate::settings::Think::parse_types)]
    think_types: [bool; 3],
    /// The temperature a choice answer that thought is served at (default:
    /// the type's own).
    #[arg(long, value_parser = positive)]
    think_temperature_choice: Option<f64>,
    /// The temperature a yes/no answer that thought is served at.
    #[arg(long, value_parser = positive)]
    think_temperature_noul: Option<f64>,
    /// The temperature a score answer that thought is served at.
    #[arg(long, value_parser = positive)]
    think_temperature_score: Option<f64>,
    /// The letters' temperature when neither a request nor a task sets one
    /// (default 1: the model's own probabilities).
    #[arg(long, conflicts_with = "temperature_from")]
    letter_temperature: Option<f64>,
    /// Take the default letter temperature from a run record: the
    /// temperature `decisio suite run` fitted on all its choice sets
    /// (docs/gates.md).
    #[arg(long, value_name = "RECORD")]
    temperature_from: Option<PathBuf>,
    /// Jobs that may wait for the engine; more are answered 503.
    #[arg(long, default_value_t = Limits::default().max_queue, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_queue: usize,
    /// Prompt tokens per forward pass while reading a prompt or a state.
    #[arg(long, default_value_t = Limits::default().prefill_chunk, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    prefill_chunk: usize,
    /// Question tokens per pass on a state (MLX): a state's questions are
    /// read together as the rows of one batch, as many as fit, counted as
    /// rows times the longest row; a longer question is read alone in
    /// chunks of --prefill-chunk.
    #[arg(long, default_value_t = Limits::default().pass_tokens, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pass_tokens: usize,
    /// Budget of the prefix cache (states kept across requests), in MiB; 0
    /// turns it off. Default: the base's (2,048 where no base applies).
    #[arg(long)]
    prefix_cache_mb: Option<u64>,
    /// Expand quantized weights into dense ones at load: `auto` does when
    /// MLX computes on the CPU (its quantized kernels are slow there) and
    /// not on a GPU, as MLX's default device says at start.
    #[arg(long, value_enum, default_value = "auto")]
    dequantize: Switch,
    /// Compute attention's softmax, the MLP's SiLU, the RMS norms and the
    /// (llama) rotary embedding with the host kernels instead of MLX's ops:
    /// `auto` does when MLX computes on the CPU (its `exp` runs one element
    /// at a time there) and not on a GPU.
    #[arg(long, value_enum, default_value = "auto")]
    host_kernels: Switch,
    /// The folder that keeps registered tasks (default:
    /// $XDG_STATE_HOME/decisio, else ~/.local/state/decisio).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    #[command(flatten)]
    task_store: task_store::TaskStoreArgs,
    /// Largest body of a task registration (POST /v1/tasks) in MiB.
    #[arg(long, default_value_t = (Limits::default().max_task_body_bytes >> 20) as u64)]
    max_task_body_mb: u64,
    /// Largest request body in MiB; larger ones are answered 413.
    #[arg(long, default_value_t = (Limits::default().max_body_bytes >> 20) as u64)]
    max_body_mb: u64,
    /// How states are padded, the same on both backends: `block`
    /// front-pads each state with newlines to a multiple of --pad-block
    /// tokens, `none` does not pad. Default: `block` where the base has a
    /// block (the Qwen base: 1,056 tokens, the reference decisio's) or
    /// --pad-block is given, else `none`.
    #[arg(long, value_enum)]
    pad_policy: Option<PadArg>,
    /// The padding block in tokens. Default: the base's (the Qwen base:
    /// 1,056, vLLM's prefix-cache block of the hybrid model; the Gemma bases
    /// and models outside the bases: none). Giving it turns padding on.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    pad_block: Option<usize>,
    #[command(flatten)]
    upstream: UpstreamArgs,
}

/// How states are padded: `--pad-policy`, else front padding to
/// `--pad-block` when given, else the base's block, else none.
fn padding(args: &ServeArgs, base: Option<&'static Base>) -> Result<PadPolicy> {
    let block = args.pad_block.or(base.and_then(|b| b.pad_block));
    Ok(match (args.pad_policy, block) {
        (Some(PadArg::None), _) | (None, None) => PadPolicy::None,
        (_, Some(n)) => PadPolicy::Block(n),
        (Some(PadArg::Block), None) => bail!(
            "--pad-policy block needs --pad-block N for {}: it has no block of its own",
            base.map_or("a model outside the bases".to_string(), |b| format!(
                "base {}",
                b.name
            ))
        ),
    })
}

/// The default letter temperature: `--letter-temperature`, or the pooled
/// temperature of the record `--temperature-from` names, or 1.
fn letter_temperature(args: &ServeArgs) -> Result<f64> {
    let (lo, hi) = crate::text_route::decide::TEMPERATURE_RANGE;
    let t = match (&args.letter_temperature, &args.temperature_from) {
        (Some(t), _) => *t,
        (None, Some(path)) => {
            let record = crate::suite::record::Record::read(path)?;
            let t = record.pooled_temperature().with_context(|| {
                format!(
                    "the record {} has no choice set to take a temperature from",
                    path.display()
                )
            })?;
            tracing::info!(temperature = t, record = %path.display(), "default letter temperature from the record");
            t
        }
        (None, None) => return Ok(Limits::default().letter_temperature),
    };
    if !(lo..=hi).contains(&t) {
        bail!("the letter temperature must be within {lo} and {hi}; got {t}");
    }
    Ok(t)
}

/// A SHA-256 digest of files' contents (absent files count as empty).
fn file_digest(paths: &[PathBuf]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in paths {
        let bytes = std::fs::read(p).unwrap_or_default();
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Token ids that end a generation: generation_config.json's eos_token_id
/// (a number or a list) and the tokenizer's eos token.
fn stop_token_ids(model: &Path, tokenizer: &TextTokenizer, template: &ChatTemplate) -> Vec<u32> {
    let mut ids = model_config::read_generation(model)
        .map(|g| model_config::eos_token_ids(&g))
        .unwrap_or_default();
    let eos = template
        .special_tokens()
        .iter()
        .find(|(name, _)| name == "eos_token");
    if let Some((_, token)) = eos {
        ids.extend(tokenizer.token_to_id(token));
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// `--think-factor`: above 0, at most 1.5.
fn think_factor(v: &str) -> Result<f64, String> {
    let f: f64 = v.parse().map_err(|_| format!("`{v}` is not a number"))?;
    match f > 0.0 && f <= crate::settings::Think::MAX_FACTOR {
        true => Ok(f),
        false => Err(format!(
            "the factor must be above 0 and at most 1.5; got {f}"
        )),
    }
}

/// A temperature: a positive number.
fn positive(v: &str) -> Result<f64, String> {
    let t: f64 = v.parse().map_err(|_| format!("`{v}` is not a number"))?;
    match t.is_finite() && t > 0.0 {
        true => Ok(t),
        false => Err(format!("a temperature must be a positive number; got {t}")),
    }
}

/// Reads a conversion's config.json (an empty object when it has none,
/// which the engine then reports).
fn read_config(dir: &Path) -> serde_json::Value {
    model_config::read(dir).unwrap_or_else(|_| serde_json::json!({}))
}

/// The System One settings served: the base's (the reference's served
/// defaults for a model of no base), with the prompt-format and yes/no
/// flags given.
fn wire_settings(base: Option<&'static Base>, args: &ServeArgs) -> WireSettings {
    let settings = base.map_or(WireSettings::SERVED, |b| b.wire);
    let format = settings.format.with(
        args.system_prompt,
        args.answer_slot,
        args.label_variants,
        args.layout,
    );
    let noul = args.noul_rendering.unwrap_or(settings.noul);
    tracing::info!(?format, ?noul, "the System One prompt format");
    WireSettings {
        format,
        noul,
        ..settings
    }
}

/// The base, the conversion folder and the tokenizer folder of a `serve`.
fn choose_base(args: &ServeArgs) -> Result<(Option<&'static Base>, String, PathBuf, PathBuf)> {
    let mlx = matches!(args.backend, Backend::Mlx);
    if !args.lora.is_empty() {
        bail!(
            "LoRA adapters are not served (--lora {}): merge the adapter into the weights \
             (for example `mlx_lm.fuse`) and pass the merged conversion with --model",
            args.lora.join(", ")
        );
    }
    if let Some(url) = args.upstream.head_upstream.as_ref().filter(|_| mlx) {
        bail!(
            "--head-upstream {url}: the MLX backend refuses a second-engine head; it \
             applies task heads to its own hidden states. A head upstream serves the \
             vLLM backend (--backend vllm)"
        );
    }
    let arg = BaseArg::parse(args.base.as_deref());
    let base_config = match &arg {
        BaseArg::Checkpoint(repo) => Some(read_config(&hub::resolve(repo, None, Wanted::Config)?)),
        _ => None,
    };
    let named = match &arg {
        BaseArg::Named(n) => {
            Some(bases::by_name(n).ok_or_else(|| BaseError::UnknownName(n.clone()))?)
        }
        _ => None,
    };
    let model = match &args.model {
        Some(m) => m.clone(),
        // A vLLM upstream says what it serves: the model its server was
        // started with.
        None if !mlx => upstream_model(&args.upstream)?,
        None => named
            .unwrap_or_else(bases::default_base)
            .default_conversion()
            .repository
            .to_string(),
    };
    // The refusals need config.json alone: a refused conversion's weights
    // are never downloaded.
    let config = read_config(&hub::resolve(&model, None, Wanted::Config)?);
    let base = bases::choose(&arg, &model, &config, base_config.as_ref(), mlx)?;
    // The vLLM backend builds prompts from config.json and the tokenizer;
    // the weights stay upstream.
    let model_dir = if mlx {
        hub::resolve(&model, None, Wanted::Model)?
    } else {
        hub::resolve(&model, None, Wanted::Tokenizer)?
    };
    let tokenizer_dir = match (&args.tokenizer, base) {
        (Some(t), _) => hub::resolve(t, None, Wanted::Tokenizer)?,
        (None, Some(b)) => {
            let source = b.tokenizer;
            let spec = match source.revision {
                Some(rev) => format!("{}@{rev}", source.repository),
                None => source.repository.to_string(),
            };
            hub::resolve(source.repository, source.revision, Wanted::Tokenizer).with_context(
                || {
                    format!(
                        "base {} builds prompts with {spec}'s tokenizer and chat template; \
                     pass --tokenizer FOLDER to use another",
                        b.name
                    )
                },
            )?
        }
        (None, None) => model_dir.clone(),
    };
    match base {
        Some(b) => tracing::info!(base = b.name, model = %model, "serving a base"),
        None => {
            tracing::info!(model = %model, "serving a model outside the bases, with the generic settings")
        }
    }
    Ok((base, model, model_dir, tokenizer_dir))
}

/// Runs `decisio serve`: loads the model and serves it until the process
/// is stopped.
pub fn run(args: ServeArgs) -> Result<()> {
    let (base, model, model_dir, tokenizer_dir) = choose_base(&args)?;
    let prefix_cache_mb = args
        .prefix_cache_mb
        .or(base.map(|b| b.prefix_cache_mib))
        .unwrap_or(Limits::default().prefix_cache_mib);
    let tokenizer = TextTokenizer::from_file(tokenizer_dir.join("tokenizer.json"))
        .with_context(|| format!("loading the tokenizer of {}", tokenizer_dir.display()))?;
    let template = ChatTemplate::from_tokenizer_config(tokenizer_dir.join("tokenizer_config.json"))
        .with_context(|| format!("loading the chat template of {}", tokenizer_dir.display()))?;
    let limits = Limits {
        max_logprobs: args.max_logprobs,
        max_queue: args.max_queue,
        max_body_bytes: (args.max_body_mb as usize) << 20,
        max_task_body_bytes: (args.max_task_body_mb as usize) << 20,
        prefill_chunk: args.prefill_chunk,
        pass_tokens: args.pass_tokens,
        prefix_cache_mib: prefix_cache_mb,
        max_model_len: args.max_model_len,
        over_limit: args.over_limit,
        over_limit_tokens: args.over_limit_tokens,
        header_limit: args.header_limit,
        think: crate::settings::Think {
            on: args.think,
            factor: args.think_factor,
            budget: args.think_budget,
            types: args.think_types,
            temperatures: [
                args.think_temperature_choice,
                args.think_temperature_noul,
                args.think_temperature_score,
            ],
            ..Default::default()
        },
        letter_temperature: letter_temperature(&args)?,
        ..Limits::default()
    };
    // A store that cannot be opened stops the start before the model loads.
    let shared = args.task_store.open()?;
    let metrics = Arc::new(Metrics::new());
    let padding = padding(&args, base)?;
    if !matches!(args.backend, Backend::Vllm) && !args.upstream.upstreams.is_empty() {
        bail!("--upstream needs --backend vllm");
    }
    let engine: Arc<dyn Engine> = match args.backend {
        Backend::Mlx => Arc::new(MlxEngine::start(
            model_dir.clone(),
            MlxOptions {
                load: load_options(args.dequantize, args.host_kernels),
                prefix_cache_mib: prefix_cache_mb,
                metrics: metrics.clone(),
                max_queue: limits.max_queue,
                prefill_chunk: limits.prefill_chunk,
                pass_tokens: limits.pass_tokens,
                answers_per_state: limits.answers_per_state,
            },
        )?),
        Backend::Vllm => vllm_engine(
            &args,
            &model_dir,
            &tokenizer,
            padding,
            &limits,
            metrics.clone(),
        )?,
    };
    let stops = stop_token_ids(&model_dir, &tokenizer, &template);
    let wire = wire_settings(base, &args);
    let model_name = args.served_model_name.unwrap_or_else(|| model.clone());
    let config = RouteConfig {
        stop_token_ids: stops,
        limits: limits.clone(),
        model_name: model_name.clone(),
        tokenizer_identity: file_digest(&[
            tokenizer_dir.join("tokenizer.json"),
            tokenizer_dir.join("tokenizer_config.json"),
        ]),
        default_temperature: limits.letter_temperature,
        base,
        wire,
        padding,
        metrics,
    };
    let route = TextRoute::new(engine, tokenizer, template, config)
        .map_err(|e| anyhow::anyhow!("{e}; this model cannot serve decisions"))?;
    let route = Arc::new(route);
    let state_dir = args
        .state_dir
        .unwrap_or_else(crate::tasks::store::default_dir);
    let tasks = TaskRegistry::open(
        &state_dir,
        route.clone(),
        TaskLimits {
            max_tasks: limits.max_tasks,
        },
        shared,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut state = AppState::new(
        route,
        model_name,
        model.clone(),
        args.api_key,
        limits,
        tasks,
    );
    state.reference_field_names = args.reference_field_names;
    // The vLLM backend's failure says what it waited for.
    let failed = match args.backend {
        Backend::Mlx => "the model failed to load: ",
        Backend::Vllm => "",
    };
    exit_if_load_fails(state.route.clone(), failed);
    actix_web::rt::System::new().block_on(http::serve(state, &args.host, args.port))?;
    Ok(())
}

/// The vLLM backend of `decisio serve`: the upstreams and their limits
/// from the command line, the model's sizes from its `config.json`.
fn vllm_engine(
    args: &ServeArgs,
    model_dir: &Path,
    tokenizer: &TextTokenizer,
    padding: PadPolicy,
    limits: &Limits,
    metrics: Arc<Metrics>,
) -> Result<Arc<dyn Engine>> {
    let u = &args.upstream;
    let config = read_config(model_dir);
    let get = |k: &str| model_config::get_usize(&config, k);
    let letter_ids = TextRoute::letter_ids(tokenizer).map_err(anyhow::Error::msg)?;
    Ok(Arc::new(
        VllmEngine::start(VllmOptions {
            upstreams: u.upstreams.clone(),
            api_key: u.upstream_api_key.clone(),
            model: u.upstream_model.clone(),
            method: match u.letter_method {
                MethodArg::Auto => MethodChoice::Auto,
                MethodArg::TokenIds => MethodChoice::TokenIds,
                MethodArg::AllowedTokens => MethodChoice::AllowedTokens,
                MethodArg::TopK => MethodChoice::TopK,
            },
            pad_block: match padding {
                PadPolicy::Block(n) => Some(n),
                PadPolicy::None => None,
            },
            mode: match u.multi_question {
                ModeArg::Warm => MultiQuestion::Warm,
                ModeArg::Sequential => MultiQuestion::Sequential,
            },
            letter_ids,
            vocab_size: get("vocab_size").unwrap_or_else(|| tokenizer.vocab_size()),
            context_length: get("max_position_embeddings").unwrap_or(4096),
            architecture: config
                .get("model_type")
                .and_then(|v| v.as_str())
                .unwrap_or("unknown")
                .to_string(),
            max_queue: limits.max_queue,
            limits: UpstreamLimits {
                connect_timeout_s: u.upstream_connect_timeout,
                request_timeout_s: u.upstream_timeout,
                generate_timeout_s: u.upstream_generate_timeout,
                probe_timeout_s: u.upstream_probe_timeout,
                wait_s: u.upstream_wait,
                health_interval_s: u.health_interval,
                eject_after: u.eject_after,
                readmit_after: u.readmit_after,
                retries: u.upstream_retries,
                backoff_ms: u.upstream_backoff_ms,
                fan_out: u.fan_out,
                batch_tokens: u.upstream_batch_tokens,
                batch_prompts: u.upstream_batch_prompts,
                fair_seconds: u.fair_seconds,
                fair_tokens: u.fair_tokens,
                ..UpstreamLimits::default()
            },
            metrics: metrics.clone(),
            head_upstream: u.head_upstream.clone(),
            hidden_size: get("hidden_size").or_else(|| {
                config
                    .pointer("/text_config/hidden_size")
                    .and_then(|v| v.as_u64())
                    .map(|v| v as usize)
            }),
        })
        .map_err(anyhow::Error::msg)?,
    ))
}

/// A server whose model cannot load can never answer: stop the process with
/// the loader's message instead of serving 503s forever (with the vLLM
/// backend: once `--upstream-wait` passed with no upstream admitted).
fn exit_if_load_fails(route: Arc<TextRoute>, prefix: &'static str) {
    std::thread::spawn(move || loop {
        match route.status() {
            EngineStatus::Loading | EngineStatus::Waiting(_) => {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            EngineStatus::Ready | EngineStatus::Unavailable(_) => return,
            EngineStatus::Failed(e) => {
                eprintln!("error: {prefix}{e}");
                std::process::exit(1);
            }
        }
    });
}
