//! Tests of `predict.rs` on a shape with round byte counts: 4 MoE layers of 8 experts of
//! 1 MiB, top-2, a 10 MiB spine (1 MiB embeddings, 1 MiB head), 1000 bytes of KV per token.

use super::*;
use crate::store::plan::LimitSource;

const MIB: u64 = 1 << 20;

fn shape() -> ModelShape {
    ModelShape {
        name: "t".into(),
        source: "pack".into(),
        architecture: "qwen3_moe".into(),
        layers: 4,
        moe_layers: 4,
        experts: 8,
        experts_per_token: 2,
        expert_bytes: MIB,
        reads_per_expert: 1,
        spine_bytes: 10 * MIB,
        embedding_bytes: MIB,
        head_bytes: MIB,
        largest_spine_unit: 2 * MIB,
        kv_bytes_per_token: 1000,
        state_bytes: 0,
        context_length: None,
        allowance: Allowance::estimate(0, 0),
    }
}

const M: f64 = MIB as f64;

/// Spine compute 9 MiB at 9 MiB/s = 1 s; experts 8 MiB at 8 MiB/s = 1 s.
fn inputs(budget_mib: u64, drives: &[f64]) -> PlanInputs {
    PlanInputs {
        limit: Some(MemoryLimit {
            bytes: 1 << 30,
            source: LimitSource::Cgroup,
        }),
        ram_budget: Some(budget_mib * MIB),
        ctx: 1000,
        drives: drives.iter().map(|d| d * M).collect(),
        rates: Rates {
            spine: 9.0 * M,
            expert: 8.0 * M,
            prefill: 90.0 * M,
        },
        routing: Routing::Uniform,
        prompt_tokens: vec![1],
        decode_tokens: None,
    }
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

#[test]
fn the_budget_pays_kv_io_buffers_and_spine_and_the_rest_is_cache() {
    let p = place(&shape(), 30 * MIB, 1000).unwrap();
    assert_eq!(p.kv_bytes, 1_000_000);
    assert_eq!(p.io_buffer_bytes, 2 * MIB);
    assert_eq!(p.stream_buffer_bytes, 0);
    assert_eq!(p.resident_spine_bytes, 10 * MIB);
    // 30 MiB − 1,000,000 − 2 MiB − 10 MiB
    assert_eq!(p.cache_bytes, 31_457_280 - 1_000_000 - 12_582_912);
    assert_eq!(p.cache_experts, 17);
    close(p.cached_expert_share, 17.0 / 32.0);
    close(p.hot_fraction, 30.0 / 42.0);
    assert!(!p.all_resident);
    // a budget holding every weight and the KV cache
    let all = place(&shape(), 42 * MIB + 1_000_000, 1000).unwrap();
    assert!(all.all_resident && all.cache_bytes == 0 && all.hot_fraction == 1.0);
    assert!(
        !place(&shape(), 42 * MIB + 999_999, 1000)
            .unwrap()
            .all_resident
    );
}

#[test]
fn a_spine_that_does_not_fit_is_streamed_beside_two_stream_buffers() {
    let p = place(&shape(), 10 * MIB, 1000).unwrap();
    // KV 1,000,000 + I/O buffers 2 MiB + stream buffers 2 × 2 MiB = 7,291,456
    assert_eq!(p.stream_buffer_bytes, 4 * MIB);
    assert_eq!(p.resident_spine_bytes, 10 * MIB - 7_291_456);
    assert_eq!(p.streamed_spine_bytes, 7_291_456);
    assert_eq!((p.cache_bytes, p.cache_experts), (0, 0));
    assert_eq!(
        place(&shape(), 2 * MIB, 1000).unwrap_err(),
        "--ram-budget 2.0 MiB is too small: the KV cache for 1000 tokens (976.6 KiB), stream \
         buffers (4.0 MiB) and expert I/O buffers (2.0 MiB) need at least 7.0 MiB"
    );
}

#[test]
fn hit_rates_from_uniform_routing_heat_and_a_cold_start() {
    let s = shape();
    close(hit_rate(&s, &Routing::Uniform, 17, None), 17.0 / 32.0);
    close(hit_rate(&s, &Routing::Uniform, 32, None), 1.0);
    close(hit_rate(&s, &Routing::HitRate(0.25), 17, None), 0.25);
    // 4 tokens after a 1-token prompt from an empty cache, 4.25 experts per layer: per layer
    // 0.5 + 0.875 + 1.0625 + 1.0625 hits of 2 experts a token (the cache full from the third)
    close(hit_rate(&s, &Routing::Uniform, 17, Some(4)), 14.0 / 32.0);
    // every pass of each layer uses experts 0 and 1 (a dense layer's zero row is skipped)
    let mut counts = vec![vec![0u64; 8]];
    counts.extend((0..4).map(|_| vec![4, 4, 0, 0, 0, 0, 0, 0]));
    close(hit_rate(&s, &Routing::Heat(counts.clone()), 17, None), 1.0);
    close(hit_rate(&s, &Routing::Heat(counts.clone()), 4, None), 0.5);
    // the hot pair is met by the prompt and kept: every decoded token hits
    close(hit_rate(&s, &Routing::Heat(counts), 8, Some(4)), 1.0);
}

#[test]
fn the_ladder_adds_drives_until_compute_bounds() {
    let p = plan(&shape(), &inputs(30, &[1.5, 1.5])).unwrap();
    close(p.hit_rate, 17.0 / 32.0);
    assert_eq!(p.hit_rate_source, "uniform routing");
    let (one, two) = (&p.ladder[0], &p.ladder[1]);
    // expert reads 8 × 15/32 MiB = 3.75 MiB per token: 2.5 s at 1.5 MiB/s, 1.25 s at 3
    close(one.expert_read_s, 2.5);
    close(one.compute_s, 2.0);
    close(one.decode_tok_s, 1.0 / 3.5);
    assert_eq!(one.bound, "drives");
    close(two.expert_read_s, 1.25);
    close(two.decode_tok_s, 1.0 / 2.25);
    assert_eq!(two.bound, "compute");
    // a 1-token prompt touches 2 of 8 experts per layer: 8 MiB at 1.5 MiB/s; compute 16 MiB
    // at 90 MiB/s plus the head at 9 MiB/s
    let t = &one.ttft[0];
    close(t.touched_fraction, 0.25);
    close(t.io_floor_s, 8.0 / 1.5);
    close(t.compute_s, 16.0 / 90.0 + 1.0 / 9.0);
    close(t.ttft_s, 8.0 / 1.5);
    assert_eq!(t.bound, "drives");
    // one more drive: 0.5 tok/s; twice the RAM (60 MiB) holds everything: 0.5 tok/s; twice
    // the compute: 1 / (0.5 + 1.25)
    close(p.add_first.one_more_drive_tok_s, 0.5);
    close(p.add_first.double_ram_tok_s, 0.5);
    close(p.add_first.double_compute_tok_s, 1.0 / 1.75);
    assert_eq!(p.add_first.resource, "compute");
    let r = &p.recommend;
    assert_eq!(r.ram_budget, 30 * MIB);
    // half of the 18 MiB beside the spine and the I/O buffers, at 1000 bytes a token
    assert_eq!(r.ctx_size, Some(9 * MIB / 1000));
    assert_eq!(r.placement, Some("stripe"));
    assert_eq!((r.pack, r.pack_reason.as_str()), (false, "already a pack"));
}

#[test]
fn a_streamed_spine_is_ram_bound() {
    let mut s = shape();
    s.source = "gguf".into();
    s.reads_per_expert = 3;
    let p = plan(&s, &inputs(10, &[1.0])).unwrap();
    let r = &p.ladder[0];
    // no cache: 8 experts of 1 MiB + 3 × 4 KiB each; KV 1,000,000 + I/O buffers 2 × (1 MiB +
    // 12 KiB) + stream buffers 4 MiB = 7,316,032 spine bytes streamed at 1 MiB/s
    close(r.expert_read_s, 8.0 * (M + 12288.0) / M);
    close(r.spine_read_s, 7_316_032.0 / M);
    assert_eq!(r.bound, "drives");
    let mut s2 = s.clone();
    s2.largest_spine_unit = 3 * MIB;
    let p2 = plan(&s2, &inputs(10, &[1.0])).unwrap();
    assert_eq!(p2.ladder[0].bound, "RAM");
    assert_eq!(p.hit_rate, 0.0);
    assert!(p.recommend.pack);
    assert_eq!(
        p.recommend.pack_reason,
        "experts are read on demand: a pack reads each in 1 request instead of 3"
    );
    assert_eq!(p.recommend.placement, None);
}

#[test]
fn the_default_budget_is_run_s_and_bad_inputs_are_refused() {
    let mut inp = inputs(30, &[1.0]);
    inp.ram_budget = None;
    inp.limit = Some(MemoryLimit {
        bytes: 100 * MIB,
        source: LimitSource::Cgroup,
    });
    // half the limit (90% less 256 MiB leaves nothing), within the limit less the allowance
    assert_eq!(budget(&shape(), &inp), Ok(50 * MIB));
    inp.limit = None;
    assert_eq!(
        budget(&shape(), &inp).unwrap_err(),
        "no memory limit is known here: give --ram or --ram-budget"
    );
    let mut inp = inputs(30, &[]);
    assert_eq!(
        plan(&shape(), &inp).unwrap_err(),
        "no drive: give --drives or --drive-bandwidth"
    );
    inp.drives = vec![0.0];
    assert_eq!(
        plan(&shape(), &inp).unwrap_err(),
        "a drive bandwidth must be more than 0 bytes per second"
    );
    let mut inp = inputs(2000, &[1.0]);
    assert_eq!(
        plan(&shape(), &inp).unwrap_err(),
        "--ram-budget 2.0 GiB is more than the memory limit of 1.0 GiB (cgroup) this process may use"
    );
    inp.ram_budget = Some(30 * MIB);
    inp.rates.prefill = f64::NAN;
    assert_eq!(
        plan(&shape(), &inp).unwrap_err(),
        "a compute rate must be more than 0 bytes per second"
    );
}
