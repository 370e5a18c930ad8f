"""Test helpers for the Open-Sora port, written from OPENSORA.md's facts independently of the port.

- `official_tiny_checkpoint`: a synthetic state dict with the OFFICIAL key names and shapes
  (OPENSORA.md §2) for the tiny config, built from the table below (not from the converter).
- `reference_forward` and the block functions: the official computation (OPENSORA.md §4-5) in
  plain torch ops on that official state dict (fused v_mlp, shift-first final layer, explicit
  softmax attention, rotate-half RoPE written element by element).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# hidden 64 = 2 heads x 32; axes_dim sums to 32; everything else small.
TINY = dict(
    in_channels=64, patch_size=2, vec_in_dim=16, context_in_dim=32, hidden_size=64, num_heads=2,
    depth=1, depth_single_blocks=1, mlp_ratio=4.0, axes_dim=[8, 12, 12], theta=10000, cond_in_channels=68,
)


def official_key_table(cfg: dict) -> dict[str, tuple[int, ...]]:
    """OPENSORA.md §2, row by row, for a config (C = hidden, M = mlp hidden, D = head dim)."""
    C, M, D = cfg["hidden_size"], int(cfg["hidden_size"] * cfg["mlp_ratio"]), cfg["hidden_size"] // cfg["num_heads"]
    t: dict[str, tuple[int, ...]] = {
        "img_in.weight": (C, cfg["in_channels"]), "img_in.bias": (C,),
        "time_in.in_layer.weight": (C, 256), "time_in.in_layer.bias": (C,),
        "time_in.out_layer.weight": (C, C), "time_in.out_layer.bias": (C,),
        "vector_in.in_layer.weight": (C, cfg["vec_in_dim"]), "vector_in.in_layer.bias": (C,),
        "vector_in.out_layer.weight": (C, C), "vector_in.out_layer.bias": (C,),
        "cond_in.weight": (C, cfg["cond_in_channels"]), "cond_in.bias": (C,),
        "txt_in.weight": (C, cfg["context_in_dim"]), "txt_in.bias": (C,),
        "final_layer.linear.weight": (cfg["in_channels"], C), "final_layer.linear.bias": (cfg["in_channels"],),
        "final_layer.adaLN_modulation.1.weight": (2 * C, C), "final_layer.adaLN_modulation.1.bias": (2 * C,),
    }
    for i in range(cfg["depth"]):
        for s in ("img", "txt"):
            p = f"double_blocks.{i}.{s}"
            t[f"{p}_mod.lin.weight"], t[f"{p}_mod.lin.bias"] = (6 * C, C), (6 * C,)
            for proj in ("q_proj", "k_proj", "v_proj", "proj"):
                t[f"{p}_attn.{proj}.weight"], t[f"{p}_attn.{proj}.bias"] = (C, C), (C,)
            t[f"{p}_attn.norm.query_norm.scale"] = t[f"{p}_attn.norm.key_norm.scale"] = (D,)
            t[f"{p}_mlp.0.weight"], t[f"{p}_mlp.0.bias"] = (M, C), (M,)
            t[f"{p}_mlp.2.weight"], t[f"{p}_mlp.2.bias"] = (C, M), (C,)
    for j in range(cfg["depth_single_blocks"]):
        p = f"single_blocks.{j}"
        for proj in ("q_proj", "k_proj"):
            t[f"{p}.{proj}.weight"], t[f"{p}.{proj}.bias"] = (C, C), (C,)
        t[f"{p}.v_mlp.weight"], t[f"{p}.v_mlp.bias"] = (C + M, C), (C + M,)
        t[f"{p}.linear2.weight"], t[f"{p}.linear2.bias"] = (C, C + M), (C,)
        t[f"{p}.norm.query_norm.scale"] = t[f"{p}.norm.key_norm.scale"] = (D,)
        t[f"{p}.modulation.lin.weight"], t[f"{p}.modulation.lin.bias"] = (3 * C, C), (3 * C,)
    return t


def official_tiny_checkpoint(cfg: dict = TINY, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fp32 tensors under the official names. Norm scales are 1 + noise (not all-ones) so that
    a query/key or image/text scale mix-up changes the output."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in official_key_table(cfg).items():
        if name.endswith(".scale"):
            sd[name] = 1 + 0.3 * torch.randn(shape, generator=g)
        elif name.endswith(".weight"):
            sd[name] = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        else:
            sd[name] = 0.1 * torch.randn(shape, generator=g)
    return sd


def tiny_inputs(batch: int = 2, frames: int = 2, h: int = 3, w: int = 4, txt_len: int = 5, seed: int = 1) -> dict:
    """Forward kwargs: h, w in patch units, positions (t, h, w) t-major; cond random (exercises cond_in)."""
    g = torch.Generator().manual_seed(seed)
    grid = [(t, i, j) for t in range(frames) for i in range(h) for j in range(w)]
    ids = torch.tensor(grid, dtype=torch.float32)[None].expand(batch, -1, -1)
    n = len(grid)
    return dict(
        img=torch.randn(batch, n, TINY["in_channels"], generator=g),
        img_ids=ids,
        txt=torch.randn(batch, txt_len, TINY["context_in_dim"], generator=g),
        txt_ids=torch.zeros(batch, txt_len, 3),
        timesteps=torch.rand(batch, generator=g),
        y_vec=torch.randn(batch, TINY["vec_in_dim"], generator=g),
        cond=torch.randn(batch, n, TINY["cond_in_channels"], generator=g),
    )


# ---- the official computation, plain ops ---------------------------------------------------------


def ref_rope_angles(ids: torch.Tensor, axes_dim, theta) -> torch.Tensor:
    """(L, D/2) angles: for each axis a, pos_a * theta^(-2j/d_a), j < d_a/2, axes concatenated [t|h|w]."""
    cols = []
    for a, d in enumerate(axes_dim):
        for j in range(d // 2):
            cols.append(ids[:, a].double() * theta ** (-2.0 * j / d))
    return torch.stack(cols, dim=-1).float()


def ref_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate-half by the formula, element by element over j: pairs (x_j, x_{j + D/2})."""
    half = x.shape[-1] // 2
    out = torch.empty_like(x)
    for j in range(half):
        c, s = angles[:, j].cos(), angles[:, j].sin()
        x1, x2 = x[..., j], x[..., j + half]
        out[..., j] = x1 * c - x2 * s
        out[..., j + half] = x2 * c + x1 * s
    return out


def interleaved_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Flux's convention (the trap): pairs (x_{2j}, x_{2j+1}) rotated by angle j."""
    out = torch.empty_like(x)
    for j in range(x.shape[-1] // 2):
        c, s = angles[:, j].cos(), angles[:, j].sin()
        x1, x2 = x[..., 2 * j], x[..., 2 * j + 1]
        out[..., 2 * j] = x1 * c - x2 * s
        out[..., 2 * j + 1] = x2 * c + x1 * s
    return out


def ref_linear(sd, name, x):
    return x @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]


def ref_layernorm(x, eps=1e-6):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)


def ref_rmsnorm(x, scale, eps=1e-6):
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * scale


def ref_gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def ref_silu(x):
    return x * torch.sigmoid(x)


def ref_attention(q, k, v, angles, rope=ref_rope):
    """q, k, v (B, H, L, D); RoPE on q and k, softmax(q k^T / sqrt(D)) v, output (B, L, H*D)."""
    q, k = rope(q, angles), rope(k, angles)
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    out = w @ v
    b, h, length, d = out.shape
    return out.transpose(1, 2).reshape(b, length, h * d)


def _heads(x, heads):
    b, length, c = x.shape
    return x.reshape(b, length, heads, c // heads).transpose(1, 2)


def ref_double_block(sd, i, img, txt, vec, angles, heads, rope=ref_rope):
    p = f"double_blocks.{i}"
    qkv = {}
    mods = {}
    for s, x in (("img", img), ("txt", txt)):
        m = ref_linear(sd, f"{p}.{s}_mod.lin", ref_silu(vec))[:, None, :].chunk(6, dim=-1)
        mods[s] = m  # shift1, scale1, gate1, shift2, scale2, gate2
        xm = (1 + m[1]) * ref_layernorm(x) + m[0]
        a = f"{p}.{s}_attn"
        q = ref_rmsnorm(_heads(ref_linear(sd, f"{a}.q_proj", xm), heads), sd[f"{a}.norm.query_norm.scale"])
        k = ref_rmsnorm(_heads(ref_linear(sd, f"{a}.k_proj", xm), heads), sd[f"{a}.norm.key_norm.scale"])
        v = _heads(ref_linear(sd, f"{p}.{s}_attn.v_proj", xm), heads)
        qkv[s] = (q, k, v)
    q, k, v = (torch.cat([qkv["txt"][n], qkv["img"][n]], dim=2) for n in range(3))
    attn = ref_attention(q, k, v, angles, rope)
    n_txt = txt.shape[1]
    out = {}
    for s, x, a in (("img", img, attn[:, n_txt:]), ("txt", txt, attn[:, :n_txt])):
        m = mods[s]
        x = x + m[2] * ref_linear(sd, f"{p}.{s}_attn.proj", a)
        h = (1 + m[4]) * ref_layernorm(x) + m[3]
        x = x + m[5] * ref_linear(sd, f"{p}.{s}_mlp.2", ref_gelu_tanh(ref_linear(sd, f"{p}.{s}_mlp.0", h)))
        out[s] = x
    return out["img"], out["txt"]


def ref_single_block(sd, j, x, vec, angles, heads, rope=ref_rope):
    p = f"single_blocks.{j}"
    shift, scale, gate = ref_linear(sd, f"{p}.modulation.lin", ref_silu(vec))[:, None, :].chunk(3, dim=-1)
    xm = (1 + scale) * ref_layernorm(x) + shift
    c = x.shape[-1]
    q = ref_rmsnorm(_heads(ref_linear(sd, f"{p}.q_proj", xm), heads), sd[f"{p}.norm.query_norm.scale"])
    k = ref_rmsnorm(_heads(ref_linear(sd, f"{p}.k_proj", xm), heads), sd[f"{p}.norm.key_norm.scale"])
    v_mlp = ref_linear(sd, f"{p}.v_mlp", xm)
    v, mlp = _heads(v_mlp[..., :c], heads), v_mlp[..., c:]
    attn = ref_attention(q, k, v, angles, rope)
    return x + gate * ref_linear(sd, f"{p}.linear2", torch.cat([attn, ref_gelu_tanh(mlp)], dim=-1))


def ref_timestep_embedding(t: torch.Tensor, dim: int = 256) -> torch.Tensor:
    """[cos | sin] of 1000 t * exp(-ln(1e4) j / (dim/2))."""
    j = torch.arange(dim // 2, dtype=torch.float64)
    args = (1000 * t.double())[:, None] * torch.exp(-math.log(1e4) * j / (dim // 2))[None]
    return torch.cat([args.cos(), args.sin()], dim=-1).float()


def reference_forward(sd, cfg, img, img_ids, txt, txt_ids, timesteps, y_vec, cond, rope=ref_rope):
    mlp = lambda name, x: ref_linear(sd, f"{name}.out_layer", ref_silu(ref_linear(sd, f"{name}.in_layer", x)))
    vec = mlp("time_in", ref_timestep_embedding(timesteps)) + mlp("vector_in", y_vec)
    img = ref_linear(sd, "img_in", img) + ref_linear(sd, "cond_in", cond)
    txt = ref_linear(sd, "txt_in", txt)
    angles = ref_rope_angles(torch.cat([txt_ids, img_ids], dim=1)[0], cfg["axes_dim"], cfg["theta"])
    heads = cfg["num_heads"]
    for i in range(cfg["depth"]):
        img, txt = ref_double_block(sd, i, img, txt, vec, angles, heads, rope)
    x = torch.cat([txt, img], dim=1)
    for j in range(cfg["depth_single_blocks"]):
        x = ref_single_block(sd, j, x, vec, angles, heads, rope)
    x = x[:, txt.shape[1]:]
    shift, scale = ref_linear(sd, "final_layer.adaLN_modulation.1", ref_silu(vec))[:, None, :].chunk(2, dim=-1)
    return ref_linear(sd, "final_layer.linear", (1 + scale) * ref_layernorm(x) + shift)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


# ---- a tiny pipeline, offline ------------------------------------------------------------------


def tiny_opensora_pipeline(seed: int = 0):
    """OpenSoraPipeline with tiny T5 (d 32), CLIP (d 16), HunyuanVideo VAE (16 latent ch, 8x/4x)
    and the TINY transformer, all random from configs; byte-level tokenizers built in memory."""
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from sagevideo.pipelines.opensora import OpenSoraPipeline, OpenSoraTransformer3DModel
    from sagevideo.pipelines.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        t5 = T5EncoderModel(T5Config(
            vocab_size=len(tokenizer), d_model=TINY["context_in_dim"], d_kv=16, d_ff=64, num_layers=1, num_heads=2,
            relative_attention_num_buckets=8, dropout_rate=0.0, feed_forward_proj="gated-gelu",
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        ))
        clip = CLIPTextModel(CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=TINY["vec_in_dim"], intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=77, pad_token_id=0, bos_token_id=0, eos_token_id=1,
        ))
        vae = AutoencoderKLHunyuanVideo(
            block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4, latent_channels=16,
        )
        transformer = OpenSoraTransformer3DModel(**TINY)
    pipe = OpenSoraPipeline(
        tokenizer=tokenizer, text_encoder=t5, tokenizer_2=tokenizer, text_encoder_2=clip,
        vae=vae, transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    for module in (t5, clip, vae, transformer):
        module.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---- a stand-in for the official download -------------------------------------------------------


def write_official_download(root, seed: int = 0) -> dict[str, torch.Tensor]:
    """Lay out a tiny stand-in for hpcai-tech/Open-Sora-v2 under `root`, as the official configs read it:
    Open_Sora_v2.safetensors (the tiny-opensora transformer config under the OFFICIAL key names, from
    `official_tiny_checkpoint`), hunyuan_vae.safetensors (a random HunyuanVideo VAE of tiny-opensora's
    config), google/t5-v1_1-xxl/ (a whole T5ForConditionalGeneration, decoder included, as released)
    and openai/clip-vit-large-patch14/ (a whole CLIPModel, vision tower included), each with the
    byte-level tokenizer. Returns the official transformer state dict."""
    from pathlib import Path

    from diffusers import AutoencoderKLHunyuanVideo
    from safetensors.torch import save_file
    from transformers import CLIPConfig, CLIPModel, T5Config, T5ForConditionalGeneration

    from sagevideo.pipelines.opensora import tiny
    from sagevideo.pipelines.tiny import tiny_tokenizer

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    official = official_tiny_checkpoint(tiny.TRANSFORMER_CONFIG, seed)
    save_file(official, str(root / "Open_Sora_v2.safetensors"))
    tokenizer = tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLHunyuanVideo(**tiny.VAE_CONFIG)
        t5 = T5ForConditionalGeneration(T5Config(vocab_size=len(tokenizer), **tiny.T5_CONFIG))
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      image_size=32, patch_size=16)
        clip = CLIPModel(CLIPConfig(text_config=dict(vocab_size=len(tokenizer), **tiny.CLIP_CONFIG),
                                    vision_config=vision, projection_dim=16))
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(root / "hunyuan_vae.safetensors"))
    for model, folder in ((t5, root / "google" / "t5-v1_1-xxl"), (clip, root / "openai" / "clip-vit-large-patch14")):
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    return official
