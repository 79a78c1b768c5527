//! What constrained output costs per token: `cargo run --release --example constrain_cost --
//! [MODEL] [TOKENS]` (defaults: the demo model, 300 tokens). Builds the grammar compiler of the
//! model's vocabulary ([`Guide::new`], once per server), compiles a JSON schema and a Lark
//! grammar, then samples `TOKENS` tokens from random logits under each (greedy, as the server
//! decodes by default) with and without the constraint, and prints the time per token of the
//! steered sampler against the plain one: the difference is llguidance's mask and advance.
//! No model pass is run: the figures are the sampler's alone.
use std::time::Instant;

use deltafin::engine::sampler::Rng;
use deltafin::engine::{GrammarSpec, Guide, Sampler, SamplerConfig, Steering};
use deltafin::load::open_any;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = match args.first() {
        Some(p) if p != "-" => std::path::PathBuf::from(p),
        _ => deltafin::pull::ensure_demo_model()?,
    };
    let tokens: usize = args.get(1).map_or(300, |s| s.parse().expect("TOKENS"));
    let tok = open_any(Some(&path))?.tokenizer()?;
    let n = tok.vocab_size();
    let t = Instant::now();
    let guide = Guide::new(&tok)?;
    println!(
        "vocabulary {n} tokens: Guide::new {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "address": {"type": "object", "properties": {
                "city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]}
        },
        "required": ["name", "age", "tags", "address"]
    });
    let specs = [
        ("json_schema", GrammarSpec::JsonSchema(schema)),
        ("json_object", GrammarSpec::JsonObject),
        (
            "lark",
            GrammarSpec::Lark("start: WORD (\" \" WORD)*\nWORD: /[a-z]+/".into()),
        ),
    ];
    let mut rng = Rng::new(1);
    let rows: Vec<Vec<f32>> = (0..tokens)
        .map(|_| (0..n).map(|_| (rng.next_f64() * 10.0) as f32).collect())
        .collect();
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    };
    let time = |mut s: Sampler| {
        let t = Instant::now();
        let mut history = Vec::new();
        for r in &rows {
            let id = s.sample(&mut r.clone(), &history);
            history.push(id);
            if tok.is_eog(id) {
                break;
            }
        }
        (t.elapsed().as_secs_f64() * 1e3, history.len())
    };
    let (plain_ms, plain_n) = time(Sampler::new(greedy.clone()));
    println!(
        "plain sampler: {:.3} ms/token over {plain_n} tokens",
        plain_ms / plain_n as f64
    );
    for (name, spec) in &specs {
        let t = Instant::now();
        let g = guide.compile(spec)?;
        let compile_ms = t.elapsed().as_secs_f64() * 1e3;
        let st = Steering {
            eog: tok.eog_ids().to_vec(),
            grammar: Some(g),
            ..Default::default()
        };
        let (ms, k) = time(Sampler::steered(greedy.clone(), st));
        let per = ms / k as f64;
        println!(
            "{name}: compile {compile_ms:.1} ms; {per:.3} ms/token over {k} tokens \
             (+{:.3} ms/token over plain)",
            per - plain_ms / plain_n as f64
        );
    }
    Ok(())
}
