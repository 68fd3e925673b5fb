//! The Llama family on the Luminal graph: one graph, compiled once, serves prefill and decode.
//!
//! Dynamic dims: `s` (tokens in this call), `p` (tokens already in the KV cache) and `n_out`
//! (how many of the last positions get logits: 1 when generating, `s` when scoring). The
//! caches are state inputs `[kv_heads, max_ctx, head_dim]` written in place each call.

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::model::Model;
use luminal::prelude::*;
use luminal_io::{GgufFile, SafetensorsModel, Tokenizer};
use luminal_nn::{
    hadamard, CacheType, Embedding, KvCache, Linear, Module, RmsNorm, Rope, TransformerBlock,
    KV_ROTATION,
};
use rayon::prelude::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// How to load a model (the backend, and its threads, are the caller's choice).
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// KV-cache capacity in tokens (capped by the model's context length).
    pub max_ctx: usize,
    /// Element type of the KV cache (f16 halves its memory and the bytes each decode step
    /// reads, q8_0 takes 0.53× of f16; see `benches/README.md` for their perplexity effect).
    pub cache_type: CacheType,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_ctx: 2048,
            // llama.cpp's default too; measured in benches/README.md (2026-11-24, fourth
            // session): perplexity +0.1%, less memory, decode at depth no slower.
            cache_type: CacheType::F16,
        }
    }
}

/// Where the weights come from.
pub(crate) enum WeightSource<'a> {
    Gguf(&'a GgufFile),
    Safetensors(&'a SafetensorsModel),
}

/// The HF names of the 2-D weight matrices (those a file may store quantized).
fn matrix_names(c: &LlamaConfig) -> Vec<String> {
    let mut names = vec!["model.embed_tokens.weight".to_string()];
    if !c.tie_word_embeddings {
        names.push("lm_head.weight".into());
    }
    for i in 0..c.n_layers {
        names.extend(layer_matrix_names(i));
    }
    names
}

/// The HF names of block `i`'s weight matrices.
pub(crate) fn layer_matrix_names(i: usize) -> impl Iterator<Item = String> {
    [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]
    .into_iter()
    .map(move |m| format!("model.layers.{i}.{m}.weight"))
}

impl WeightSource<'_> {
    /// The file's name of the tensor the graph input `name` (HF naming) stands for, after
    /// checking that the file holds it with `shape`.
    pub(crate) fn checked_name(&self, name: &str, shape: &[usize]) -> Result<String> {
        let weight_err = |what: String| ModelError::Weight {
            name: name.to_string(),
            what,
        };
        let (file_name, found) = match self {
            WeightSource::Gguf(f) => {
                let file_name = gguf_name(name).ok_or_else(|| weight_err("no GGUF name".into()))?;
                let info = f
                    .tensor_info(&file_name)
                    .map_err(|_| weight_err(format!("{file_name} is missing from the file")))?;
                let found = info.shape();
                (file_name, found)
            }
            WeightSource::Safetensors(st) => {
                let info = st
                    .tensor_info(name)
                    .map_err(|_| weight_err("missing from the safetensors files".into()))?;
                (name.to_string(), info.shape().to_vec())
            }
        };
        if found != shape {
            return Err(weight_err(format!(
                "{file_name} has shape {found:?}, expected {shape:?}"
            )));
        }
        Ok(file_name)
    }

    /// Reads the tensor the graph input `name` stands for, as f32.
    pub(crate) fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let file_name = self.checked_name(name, shape)?;
        Ok(match self {
            WeightSource::Gguf(f) => f.tensor_f32(&file_name)?,
            WeightSource::Safetensors(st) => st.tensor_f32(&file_name)?,
        })
    }

    /// The dtype the file stores the 2-D weight `name` in, when a graph can hold it as is
    /// (quantized or half: read in place by the backend, never converted to f32).
    pub(crate) fn storage_dtype(&self, name: &str) -> Option<DType> {
        let (dtype, shape) = match self {
            WeightSource::Gguf(f) => {
                let info = f.tensor_info(&gguf_name(name)?).ok()?;
                (info.ggml_type().dtype()?, info.shape())
            }
            WeightSource::Safetensors(st) => {
                let info = st.tensor_info(name).ok()?;
                let dtype = match info.dtype() {
                    luminal_io::Dtype::F16 => DType::F16,
                    luminal_io::Dtype::BF16 => DType::BF16,
                    _ => return None,
                };
                (dtype, info.shape().to_vec())
            }
        };
        // Rows are whole blocks in any file ggml wrote; anything else is decoded to f32.
        let whole_rows = shape.len() == 2 && shape[1].is_multiple_of(dtype.block_size());
        (dtype != DType::F32 && whole_rows).then_some(dtype)
    }

    /// The data of the weight `name` stored as `dtype` (see [`Self::storage_dtype`]): a
    /// window onto the mapped file, no copy. Checks the shape.
    pub(crate) fn data(&self, name: &str, shape: &[usize], dtype: DType) -> Result<HostData> {
        let file_name = self.checked_name(name, shape)?;
        let data = match self {
            WeightSource::Gguf(f) => f.tensor_data(&file_name)?,
            WeightSource::Safetensors(st) => st.tensor_data(&file_name)?,
        };
        if data.dtype() != dtype {
            return Err(ModelError::Weight {
                name: name.to_string(),
                what: format!("is {}, expected {dtype}", data.dtype()),
            });
        }
        Ok(data)
    }
}

/// The graph input (and GGUF tensor) of Llama 3.1+ RoPE frequency factors `[head_dim / 2]`:
/// each inverse frequency is divided by its factor, as in llama.cpp.
/// Longest prompt piece one run processes: longer prompts are fed in chunks of this many
/// tokens (llama.cpp's default batch size), keeping prefill memory flat in the prompt length.
pub const PREFILL_CHUNK: usize = 512;

const ROPE_FREQS: &str = "rope_freqs.weight";

/// The GGUF tensor name of a Hugging Face parameter name.
pub fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        ROPE_FREQS => Some(ROPE_FREQS),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, kind) = rest.rsplit_once('.')?;
    let short = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{kind}"))
}

/// Load-time statistics.
#[derive(Clone, Debug, Default)]
pub struct LoadStats {
    pub load_time: Duration,
    pub parameters: usize,
}

/// A compiled Llama-family model with its KV cache, on any backend's runtime `R`.
pub struct LlamaModel<R> {
    config: LlamaConfig,
    runtime: R,
    tokens: TensorRef,
    logits: TensorRef,
    caches: Vec<TensorRef>,
    cache_type: CacheType,
    max_ctx: usize,
    pos: usize,
    /// The token ids of the last call, as the graph's i32 input (kept: no allocation).
    ids: Vec<i32>,
    pub stats: LoadStats,
}

impl<R> std::fmt::Debug for LlamaModel<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel")
            .field("config", &self.config)
            .field("max_ctx", &self.max_ctx)
            .field("cache_type", &self.cache_type)
            .field("pos", &self.pos)
            .finish()
    }
}

/// A compiled Llama model still without its weights ([`LlamaModel::fill`]).
struct Compiled<R> {
    model: LlamaModel<R>,
    /// Each parameter: handle, name, shape, dtype.
    params: Vec<(TensorRef, String, Vec<usize>, DType)>,
}

impl<R: Runtime> LlamaModel<R> {
    /// Loads a GGUF file or a Hugging Face folder (config.json + safetensors +
    /// tokenizer.json) and compiles it with `backend`. `progress(done, total)` is called as
    /// weights are handed to the runtime.
    ///
    /// Quantized and half-precision weight matrices stay as the file stores them (a window
    /// onto the memory-mapped file): the backend reads them in place.
    pub fn load<B: Backend<Runtime = R>>(
        path: impl AsRef<Path>,
        backend: B,
        opts: &LoadOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<(LlamaModel<R>, Tokenizer)> {
        let path = path.as_ref();
        if path.is_dir() {
            Self::load_hf_dir(path, backend, opts, progress)
        } else {
            Self::load_gguf(path, backend, opts, progress)
        }
    }

    pub fn load_gguf<B: Backend<Runtime = R>>(
        path: impl AsRef<Path>,
        backend: B,
        opts: &LoadOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<(LlamaModel<R>, Tokenizer)> {
        let start = Instant::now();
        // The graph needs only the header: it is built and compiled from the mapped file
        // (the tokenizer read on another thread meanwhile), then the data is copied into
        // huge pages (`into_loaded`) once the compiler's memory is freed.
        let file = GgufFile::open(path)?;
        let has_output = file.tensor_info("output.weight").is_ok();
        // Llama 3.1+ GGUFs carry their RoPE scaling as per-frequency factors.
        let has_rope_freqs = file.tensor_info(ROPE_FREQS).is_ok();
        let config = LlamaConfig::from_gguf(file.metadata(), has_output, has_rope_freqs)?;
        let (tokenizer, compiled) = std::thread::scope(|scope| {
            let tokenizer = scope.spawn(|| Tokenizer::from_gguf(&file));
            let compiled = Self::compile(config, &WeightSource::Gguf(&file), backend, opts);
            let tokenizer = tokenizer.join().expect("the tokenizer thread panicked");
            (tokenizer, compiled)
        });
        let (tokenizer, compiled) = (tokenizer?, compiled?);
        let file = file.into_loaded()?;
        let model = Self::fill(compiled, &WeightSource::Gguf(&file), progress, start)?;
        Ok((model, tokenizer))
    }

    pub fn load_hf_dir<B: Backend<Runtime = R>>(
        dir: impl AsRef<Path>,
        backend: B,
        opts: &LoadOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<(LlamaModel<R>, Tokenizer)> {
        let start = Instant::now();
        let dir = dir.as_ref();
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path)
            .map_err(|e| ModelError::Config(format!("cannot read {}: {e}", cfg_path.display())))?;
        let config = LlamaConfig::from_hf_json(&text)?;
        let st = SafetensorsModel::load(dir)?;
        let tokenizer = Tokenizer::from_hf_dir(dir)?;
        let source = WeightSource::Safetensors(&st);
        let compiled = Self::compile(config, &source, backend, opts)?;
        let model = Self::fill(compiled, &source, progress, start)?;
        Ok((model, tokenizer))
    }

    /// Builds the graph of `config` (weight matrices typed as `source` stores them) and
    /// compiles it with `backend`; the weights are handed over by [`LlamaModel::fill`].
    fn compile<B: Backend<Runtime = R>>(
        config: LlamaConfig,
        source: &WeightSource,
        backend: B,
        opts: &LoadOptions,
    ) -> Result<Compiled<R>> {
        let c = &config;
        let max_ctx = opts.max_ctx.min(c.context_length).max(1);
        let block = opts.cache_type.dtype().block_size();
        if !c.head_dim.is_multiple_of(block) {
            return Err(ModelError::Config(format!(
                "a {} KV cache stores whole blocks of {block} values of a head, but this \
                 model's head dim is {} (choose an f16 or f32 cache)",
                opts.cache_type, c.head_dim
            )));
        }
        let cx = Graph::new();
        // Weight matrices keep the file's storage (quantized or half): read in place.
        for name in matrix_names(c) {
            if let Some(dtype) = source.storage_dtype(&name) {
                cx.set_tensor_dtype(&name, dtype);
            }
        }
        let mut rope = Rope {
            head_dim: c.head_dim,
            theta: c.rope_theta,
            layout: c.rope_layout,
            scaling: c.rope_scaling,
            freq_factors: None,
        };
        if c.rope_freq_factors {
            rope = rope.with_freq_factors(&cx, ROPE_FREQS);
        }
        let embed = Embedding::new(&cx, "model.embed_tokens", c.vocab_size, c.hidden_size);
        let layers: Vec<TransformerBlock> = (0..c.n_layers)
            .map(|i| {
                TransformerBlock::new(
                    &cx,
                    &format!("model.layers.{i}"),
                    c.hidden_size,
                    c.intermediate_size,
                    c.n_heads,
                    c.n_kv_heads,
                    c.qkv_bias,
                    rope,
                    c.rms_norm_eps,
                )
                .with_sliding_window(c.sliding_window)
            })
            .collect();
        // A 4- or 5-bit cache is kept rotated (one Walsh-Hadamard matrix for every layer)
        // where the head dim allows it.
        let rotation = (opts.cache_type.wants_rotation() && c.head_dim.is_multiple_of(KV_ROTATION))
            .then(|| cx.input("kv_rotation", (KV_ROTATION, KV_ROTATION), DType::F32));
        let caches: Vec<KvCache> = (0..c.n_layers)
            .map(|i| {
                let cache = KvCache::with_type(
                    &cx,
                    &format!("model.layers.{i}.self_attn"),
                    c.n_kv_heads,
                    max_ctx,
                    c.head_dim,
                    opts.cache_type,
                );
                match rotation {
                    Some(h) => cache.with_rotation(h),
                    None => cache,
                }
            })
            .collect();
        let norm = RmsNorm::new(&cx, "model.norm", c.hidden_size, c.rms_norm_eps);
        let lm_head = if c.tie_word_embeddings {
            Linear {
                weight: embed.weight,
                bias: None,
            }
        } else {
            Linear::new(&cx, "lm_head", c.hidden_size, c.vocab_size, false)
        };

        let tokens = cx.input("tokens", ("s",), DType::I32);
        let past = Expression::var("p");
        let mut x = embed.forward(tokens).unsqueeze(0); // [1, s, d]
        for (layer, cache) in layers.iter().zip(&caches) {
            x = layer.forward_cached(x, past.clone(), cache);
        }
        let s = Expression::var("s");
        let last = x.slice(1, s.clone() - Expression::var("n_out"), s);
        let logits = lm_head.forward(norm.forward(last)).squeeze(0).output(); // [n_out, vocab]

        let mut params: Vec<GraphTensor> = embed.parameters();
        params.extend(rope.parameters());
        for l in &layers {
            params.extend(l.parameters());
        }
        params.extend(norm.parameters());
        if !c.tie_word_embeddings {
            params.extend(lm_head.parameters());
        }
        let cache_refs: Vec<TensorRef> = caches
            .iter()
            .flat_map(|k| [k.k.handle(), k.v.handle()])
            .collect();
        let mut runtime = cx.compile(backend, CompileOptions::default())?;
        if let Some(h) = rotation {
            runtime.set(h, &hadamard(KV_ROTATION))?;
        }
        let params = params
            .iter()
            .map(|t| {
                let shape = t
                    .shape()
                    .iter()
                    .map(|d| d.as_constant().unwrap_or(0) as usize)
                    .collect();
                (t.handle(), luminal_nn::parameter_name(*t), shape, t.dtype())
            })
            .collect();
        let model = LlamaModel {
            config,
            runtime,
            tokens: tokens.handle(),
            logits: logits.handle(),
            caches: cache_refs,
            cache_type: opts.cache_type,
            max_ctx,
            pos: 0,
            ids: Vec::new(),
            stats: LoadStats::default(),
        };
        Ok(Compiled { model, params })
    }

    /// Hands the weights of `source` to the runtime of `compiled`: the loaded model.
    fn fill(
        compiled: Compiled<R>,
        source: &WeightSource,
        mut progress: impl FnMut(usize, usize),
        start: Instant,
    ) -> Result<LlamaModel<R>> {
        let Compiled {
            mut model,
            params: named,
        } = compiled;
        // Weights in their storage dtype are handed over as windows onto the file; f32
        // ones (norms, f32 files) are decoded, in parallel, in chunks so the bar moves.
        let total = named.len();
        let mut parameters = 0;
        progress(0, total);
        for (done, chunk) in named.chunks(16).enumerate() {
            let datas: Vec<Result<HostData>> = chunk
                .par_iter()
                .map(|(_, name, shape, dtype)| match dtype {
                    DType::F32 => Ok(HostData::F32(source.read(name, shape)?)),
                    dt => source.data(name, shape, *dt),
                })
                .collect();
            for ((handle, name, _, _), data) in chunk.iter().zip(datas) {
                let data = data?;
                if let HostData::F32(v) = &data {
                    if name == ROPE_FREQS && v.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
                        return Err(ModelError::Weight {
                            name: name.clone(),
                            what: "RoPE frequency factors must be finite and positive".into(),
                        });
                    }
                }
                parameters += data.len();
                model.runtime.set_data(*handle, data)?;
            }
            progress((done * 16 + chunk.len()).min(total), total);
        }
        model.clear_cache()?;
        model.stats = LoadStats {
            load_time: start.elapsed(),
            parameters,
        };
        Ok(model)
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }
    /// The compiled runtime (kernel counts, profile).
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// One run over `tokens` (at most the whole remaining context, checked by the caller)
    /// at positions `pos..`, logits of the last `n_out` into `logits`.
    fn run_chunk(&mut self, tokens: &[u32], n_out: usize, logits: &mut Vec<f32>) -> Result<()> {
        self.ids.clear();
        self.ids.extend(tokens.iter().map(|&t| t as i32));
        self.runtime.set_dim("s", tokens.len());
        self.runtime.set_dim("p", self.pos);
        self.runtime.set_dim("n_out", n_out);
        self.runtime.set(self.tokens, &self.ids)?;
        self.runtime.run()?;
        self.pos += tokens.len();
        self.runtime.get_into(self.logits, logits)?;
        Ok(())
    }

    /// Zeros the cache buffers (done once at load).
    fn clear_cache(&mut self) -> Result<()> {
        let c = &self.config;
        let n = c.n_kv_heads * self.max_ctx * c.head_dim;
        for &r in &self.caches {
            self.runtime.set_data(r, self.cache_type.zeros(n))?;
        }
        self.pos = 0;
        Ok(())
    }
}

impl<R: Runtime> Model for LlamaModel<R> {
    fn pos(&self) -> usize {
        self.pos
    }
    fn max_ctx(&self) -> usize {
        self.max_ctx
    }
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    /// Forgets the cached tokens: the next call starts at position 0. (Stale cache rows are
    /// never read: attention only sees positions `0..pos`.)
    fn reset(&mut self) {
        self.pos = 0;
    }
    /// Rows beyond `pos` stay in the cache but are never read, and are overwritten next.
    fn truncate(&mut self, pos: usize) -> bool {
        self.pos = self.pos.min(pos);
        true
    }

    /// Runs `tokens` at positions `pos..pos + len` (appending them to the cache) and writes
    /// the logits of the last `n_out` of them, row-major `[n_out, vocab]`, into `logits`.
    fn forward_into(&mut self, tokens: &[u32], n_out: usize, logits: &mut Vec<f32>) -> Result<()> {
        if tokens.is_empty() {
            return Err(ModelError::Other("forward needs at least one token".into()));
        }
        let vocab = self.config.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::BadToken { id, vocab });
        }
        let needed = self.pos + tokens.len();
        if needed > self.max_ctx {
            return Err(ModelError::ContextFull {
                needed,
                max: self.max_ctx,
            });
        }
        let n_out = n_out.clamp(1, tokens.len());
        if tokens.len() <= PREFILL_CHUNK {
            return self.run_chunk(tokens, n_out, logits);
        }
        // A long prompt runs in chunks of `PREFILL_CHUNK` tokens, so activations (and the
        // buffers planned for them) stay bounded by the chunk whatever the prompt length.
        // Each chunk's logits are kept only for the positions asked for.
        let first_out = tokens.len() - n_out;
        logits.clear();
        let mut part = Vec::new();
        for (c, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
            let (c0, c1) = (c * PREFILL_CHUNK, c * PREFILL_CHUNK + chunk.len());
            let wanted = c1.saturating_sub(first_out.max(c0));
            self.run_chunk(chunk, wanted.max(1), &mut part)?;
            if wanted > 0 {
                logits.extend_from_slice(&part[..wanted * vocab]);
            }
        }
        Ok(())
    }

    /// Logits for every position of `tokens` from an empty cache (teacher forcing).
    fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.reset();
        self.forward(tokens, tokens.len())
    }
}
