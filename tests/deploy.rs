//! The deployment files: `docker-compose.yml` against the Compose
//! Specification's JSON schema (check-jsonschema, from the project's venv,
//! which carries the schema), the Prometheus configuration through
//! `promtool check config` (the Debian package `prometheus`), and the
//! Grafana dashboard: valid JSON whose queries name only metrics and labels
//! that a real `--backend vllm` gateway exports.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use common::Server;
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv made by `make setup` (scripts/requirements.txt).
fn venv_bin(name: &str) -> PathBuf {
    let cache = std::env::var_os("DECISIO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/decisio"));
    let path = cache.join("venv/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing; run `make setup`",
        path.display()
    );
    path
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run the checker");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

fn compose() -> serde_yaml_ng::Value {
    let text = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

#[test]
fn compose_file_follows_the_compose_specification() {
    run(Command::new(venv_bin("check-jsonschema"))
        .args(["--builtin-schema", "vendor.compose-spec"])
        .arg(root().join("docker-compose.yml")));
    let c = compose();
    let services = c["services"].as_mapping().unwrap();
    for name in ["vllm", "gateway", "prometheus", "grafana"] {
        assert!(
            services.contains_key(name),
            "service {name} missing from docker-compose.yml"
        );
    }
    // vLLM reserves an NVIDIA GPU.
    let device = &c["services"]["vllm"]["deploy"]["resources"]["reservations"]["devices"][0];
    assert_eq!(device["driver"], "nvidia");
    assert!(device["capabilities"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|v| v == "gpu"));
    // The gateway fronts it with the vLLM backend, built from the Dockerfile.
    let args: Vec<&str> = c["services"]["gateway"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for want in ["--backend=vllm", "--upstream=http://vllm:8000"] {
        assert!(args.contains(&want), "gateway lacks {want}: {args:?}");
    }
    assert!(root().join("Dockerfile").is_file());
    // vLLM returns at least the 26 letters when the letter method is top-k.
    let vllm_args: Vec<&str> = c["services"]["vllm"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let cap: usize = vllm_args
        .iter()
        .find_map(|a| a.strip_prefix("--max-logprobs="))
        .expect("--max-logprobs")
        .parse()
        .unwrap();
    assert!(cap >= 26, "--max-logprobs={cap}");
    assert!(vllm_args.contains(&"--enable-prefix-caching"));
    assert!(vllm_args.contains(&"--enable-prompt-tokens-details"));
    assert!(vllm_args.contains(&"--generation-config=vllm"));
    // By default it serves the Qwen base's vLLM checkpoint, on a pinned
    // vLLM of 0.26 or later (the first with logprob_token_ids); the
    // gateway takes the model from it (no --model) and pads to its block.
    assert!(
        vllm_args.contains(&"--model=${DECISIO_BASE:-Qwen/Qwen3.6-35B-A3B-FP8}"),
        "{vllm_args:?}"
    );
    let version = |image: &str| -> (u32, u32) {
        let tag = image
            .rsplit_once(":-v")
            .map(|(_, t)| t.trim_end_matches('}'))
            .unwrap_or_else(|| panic!("{image}: no pinned version"));
        let mut parts = tag.split('.').map(|p| p.parse::<u32>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap())
    };
    for name in ["vllm", "vllm-pooling"] {
        let image = c["services"][name]["image"].as_str().unwrap();
        assert!(version(image) >= (0, 26), "{name}: {image}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--model")), "{args:?}");
    assert!(!args.iter().any(|a| a.starts_with("--pad-")), "{args:?}");
    // The intent-heads profile: a pooling server of the same model with the
    // pooler flags vLLM 0.14 and later take, and a gateway reading it.
    let strings = |service: &str| -> Vec<String> {
        c["services"][service]["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let pooling = strings("vllm-pooling");
    assert_eq!(c["services"]["vllm-pooling"]["profiles"][0], "intent-heads");
    assert!(pooling.contains(&"--model=${DECISIO_BASE:-Qwen/Qwen3.6-35B-A3B-FP8}".into()));
    assert!(pooling.contains(&"--runner=pooling".into()));
    let pooler = pooling
        .iter()
        .find_map(|a| a.strip_prefix("--pooler-config="))
        .expect("--pooler-config");
    let pooler: Value = serde_json::from_str(pooler).unwrap();
    assert_eq!(
        pooler,
        json!({"pooling_type": "LAST", "use_activation": false})
    );
    let heads = strings("gateway-heads");
    assert_eq!(
        c["services"]["gateway-heads"]["profiles"][0],
        "intent-heads"
    );
    assert!(heads.contains(&"--head-upstream=http://vllm-pooling:8001".into()));
    // Every file mounted from the checkout exists.
    for (_, service) in services {
        for volume in service["volumes"].as_sequence().into_iter().flatten() {
            let source = volume.as_str().unwrap().split(':').next().unwrap();
            if let Some(rel) = source.strip_prefix("./") {
                assert!(root().join(rel).exists(), "{source} is mounted but missing");
            }
        }
    }
}

#[test]
fn prometheus_config_passes_promtool() {
    let path = root().join("deploy/prometheus/prometheus.yml");
    run(Command::new("promtool")
        .args(["check", "config"])
        .arg(&path));
    // It scrapes both the gateway and vLLM by their service names.
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains("gateway:8080") && text.contains("vllm:8000"));
}

/// The metric families (name and label names) a `/metrics` text exposes;
/// a histogram's `_bucket`, `_sum` and `_count` series count as its family.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut families: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, labels) = match line.split_once('{') {
            Some((n, rest)) => (n, rest.split_once('}').map(|r| r.0).unwrap_or("")),
            None => (line.split(' ').next().unwrap_or(""), ""),
        };
        let names: BTreeSet<String> = labels
            .split(',')
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
            .collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| series.strip_suffix(suffix));
        for family in std::iter::once(series).chain(base) {
            families
                .entry(family.to_string())
                .or_default()
                .extend(names.iter().cloned());
        }
    }
    families
}

/// The `decisio_…` metric names and the `by (…)` labels of one PromQL query.
fn query_names(expr: &str) -> (Vec<String>, Vec<String>) {
    let mut metrics = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("decisio_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        metrics.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    let mut labels = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("by (") {
        let tail = &rest[i + 4..];
        let end = tail.find(')').unwrap();
        labels.extend(tail[..end].split(',').map(|l| l.trim().to_string()));
        rest = &tail[end..];
    }
    (metrics, labels)
}

#[test]
fn dashboard_names_only_metrics_the_gateway_exports() {
    let path = root().join("deploy/grafana/dashboards/decisio.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // The provisioning files point Grafana at it and at Prometheus.
    let provider =
        std::fs::read_to_string(root().join("deploy/grafana/provisioning/dashboards/decisio.yml"))
            .unwrap();
    assert!(provider.contains("/var/lib/grafana/dashboards"));
    let source = std::fs::read_to_string(
        root().join("deploy/grafana/provisioning/datasources/prometheus.yml"),
    )
    .unwrap();
    assert!(source.contains("uid: prometheus") && source.contains("http://prometheus:9090"));

    // A real gateway with the vLLM backend, in front of an MLX upstream,
    // after one decision: what it exports.
    let mlx = Server::start(&[]);
    let url = mlx.url();
    let gateway = Server::start(&["--backend", "vllm", "--upstream", &url]);
    let r = gateway.post_json(
        "/v1/decide",
        &json!({"state": "The sky is blue.",
                "questions": [{"text": "What colour is the sky?", "options": ["blue", "green"]}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let metrics = gateway
        .request("GET", "/metrics", &[], None)
        .unwrap()
        .text();
    let families = exported(&metrics);

    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8, "only {} panels", panels.len());
    let mut seen = BTreeSet::new();
    for panel in panels {
        assert_eq!(
            panel["datasource"]["uid"], "prometheus",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let (names, labels) = query_names(expr);
            assert!(!names.is_empty(), "no decisio metric in `{expr}`");
            for name in &names {
                let Some(known) = families.get(name) else {
                    panic!("`{expr}` names {name}, which the gateway does not export");
                };
                for label in &labels {
                    assert!(
                        label == "le" || known.contains(label),
                        "`{expr}` groups by {label}, not a label of {name} ({known:?})"
                    );
                }
                let family = name.strip_suffix("_bucket").unwrap_or(name);
                seen.insert(family.to_string());
            }
        }
    }
    // The upstream, HTTP, latency and System One families are all on the dashboard.
    for name in [
        "decisio_http_requests_total",
        "decisio_http_request_seconds",
        "decisio_question_seconds",
        "decisio_new_state_seconds",
        "decisio_systemone_questions_total",
        "decisio_systemone_question_seconds",
        "decisio_upstream_requests_total",
        "decisio_upstream_request_seconds",
        "decisio_upstream_in_flight",
        "decisio_upstream_ejected",
        "decisio_upstream_retries_total",
    ] {
        assert!(seen.contains(name), "{name} is not on the dashboard");
    }
}

#[test]
fn the_scaled_profile_puts_replicas_on_one_task_store_behind_a_balancer() {
    let c = compose();
    let s = &c["services"];
    for name in [
        "task-store",
        "task-store-bucket",
        "gateway-replica",
        "balancer",
    ] {
        let profiles = s[name]["profiles"].as_sequence().unwrap();
        assert!(profiles.iter().any(|p| p == "scaled"), "{name}");
    }
    let args: Vec<&str> = s["gateway-replica"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        args.contains(&"--task-store=s3://decisio-tasks/fleet"),
        "{args:?}"
    );
    assert!(args.contains(&"--upstream=http://vllm:8000"), "{args:?}");
    // Two replicas or more by default, each with a state folder of its own.
    let replicas = s["gateway-replica"]["deploy"]["replicas"].as_str().unwrap();
    let default: u32 = replicas
        .trim_start_matches("${GATEWAY_REPLICAS:-")
        .trim_end_matches('}')
        .parse()
        .unwrap();
    assert!(default >= 2, "{replicas}");
    assert!(
        s["gateway-replica"]["ports"].is_null(),
        "the balancer publishes, not the replicas"
    );
    let env = &s["gateway-replica"]["environment"];
    assert_eq!(env["AWS_ENDPOINT_URL"], "http://task-store:9000");
    // The balancer's configuration spreads over the replicas' port.
    let conf = std::fs::read_to_string(root().join("deploy/nginx/scaled.conf")).unwrap();
    assert!(
        conf.contains("server gateway-replica:8080 resolve;"),
        "{conf}"
    );
    let mount = s["balancer"]["volumes"][0].as_str().unwrap();
    assert!(mount.starts_with("./deploy/nginx/scaled.conf:"), "{mount}");
}
