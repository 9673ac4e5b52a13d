"""The float64 formula path of the DPO/ORPO golden, in numpy only (no torch).

A Llama forward and its hand-written backward for the tiny model (HF LlamaForCausalLM semantics:
RMSNorm, rotate-half RoPE, causal attention with right padding, SiLU-gated MLP, untied lm_head),
optional LoRA on some projections (W x + scale B A x), the per-token log-probabilities of
tokens t+1, and the DPO (sigmoid, robust, cdpo, ipo) and ORPO losses with their derivative with
respect to those log-probabilities. dpo_golden.py uses it for every case's `formula` figures and
the gradients of the formula-only cases; it runs here (no GPU machine) against the committed
golden: `python3 tests/golden_gen/dpo_golden.py --formula-only ...`.
"""

import json
import os

import numpy as np

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_name(layer, proj):
    part = "mlp" if proj in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return f"model.layers.{layer}.{part}.{proj}"


def lora_names(layer, proj):
    """PEFT's names of one module's adapter, without the base_model.model. prefix."""
    base = linear_name(layer, proj)
    return f"{base}.lora_A.default.weight", f"{base}.lora_B.default.weight"


class TinyLlama:
    """float64 weights of a Llama in HF names, plus LoRA adapters keyed by PEFT names."""

    def __init__(self, model_dir, weights):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
        self.lora = {}
        self.lora_scale = 0.0
        c = self.cfg
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = c["rms_norm_eps"]
        theta = c["rope_parameters"]["rope_theta"]
        d = self.head_dim
        self.inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
        if self.kv_heads != self.heads:
            raise ValueError("the formula path covers multi-head attention only (tiny-mha)")

    def set_lora(self, adapters, scale):
        self.lora = {k: np.asarray(v, dtype=np.float64) for k, v in adapters.items()}
        self.lora_scale = scale

    def params(self, names):
        """The current values of the named weights or adapters."""
        return {n: self.lora[n] if n in self.lora else self.w[n] for n in names}

    def assign(self, values):
        for n, v in values.items():
            (self.lora if n in self.lora else self.w)[n] = v

    # ---- forward ---------------------------------------------------------------------------
    def _rms(self, h, w):
        r = 1.0 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + self.eps)
        n = h * r
        return n * w, (n, r, w)

    def _rms_back(self, dy, cache):
        n, r, w = cache
        dn = dy * w
        dw = np.sum(dy * n, axis=tuple(range(dy.ndim - 1)))
        dh = r * (dn - n * np.mean(dn * n, axis=-1, keepdims=True))
        return dh, dw

    def _lin(self, x, layer, proj, use_lora):
        name = linear_name(layer, proj)
        y = x @ self.w[name + ".weight"].T
        a_name, b_name = lora_names(layer, proj)
        if use_lora and a_name in self.lora:
            xa = x @ self.lora[a_name].T
            y = y + self.lora_scale * (xa @ self.lora[b_name].T)
            return y, (x, xa)
        return y, (x, None)

    def _lin_back(self, dy, cache, layer, proj, grads):
        x, xa = cache
        name = linear_name(layer, proj)
        w = self.w[name + ".weight"]
        dx = dy @ w
        flat_dy = dy.reshape(-1, dy.shape[-1])
        flat_x = x.reshape(-1, x.shape[-1])
        grads[name + ".weight"] = grads.get(name + ".weight", 0) + flat_dy.T @ flat_x
        if xa is not None:
            a_name, b_name = lora_names(layer, proj)
            s = self.lora_scale
            flat_xa = xa.reshape(-1, xa.shape[-1])
            grads[b_name] = grads.get(b_name, 0) + s * flat_dy.T @ flat_xa
            dxa = s * dy @ self.lora[b_name]
            grads[a_name] = grads.get(a_name, 0) + dxa.reshape(-1, dxa.shape[-1]).T @ flat_x
            dx = dx + dxa @ self.lora[a_name]
        return dx

    def _rope_tables(self, t):
        freqs = np.outer(np.arange(t, dtype=np.float64), self.inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb)[None, :, None, :], np.sin(emb)[None, :, None, :]

    @staticmethod
    def _rot(x):
        h = x.shape[-1] // 2
        return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)

    @staticmethod
    def _rot_t(y):
        h = y.shape[-1] // 2
        return np.concatenate([y[..., h:], -y[..., :h]], axis=-1)

    def forward(self, ids, attn_mask, use_lora=True):
        """Logits [B,T,V] and the cache for backward()."""
        b, t = ids.shape
        hd, nh = self.head_dim, self.heads
        cos, sin = self._rope_tables(t)
        causal = np.tril(np.ones((t, t), dtype=bool))
        allowed = causal[None, None] & (attn_mask[:, None, None, :] != 0)
        h = self.w["model.embed_tokens.weight"][ids]
        caches = []
        for layer in range(self.layers):
            pre = f"model.layers.{layer}."
            x1, c_n1 = self._rms(h, self.w[pre + "input_layernorm.weight"])
            q, c_q = self._lin(x1, layer, "q_proj", use_lora)
            k, c_k = self._lin(x1, layer, "k_proj", use_lora)
            v, c_v = self._lin(x1, layer, "v_proj", use_lora)
            q = q.reshape(b, t, nh, hd)
            k = k.reshape(b, t, nh, hd)
            v = v.reshape(b, t, nh, hd)
            qr = q * cos + self._rot(q) * sin
            kr = k * cos + self._rot(k) * sin
            scores = np.einsum("bqhd,bkhd->bhqk", qr, kr) / np.sqrt(hd)
            scores = np.where(allowed, scores, -np.inf)
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p = p / p.sum(axis=-1, keepdims=True)
            o = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, nh * hd)
            a, c_o = self._lin(o, layer, "o_proj", use_lora)
            h = h + a
            x2, c_n2 = self._rms(h, self.w[pre + "post_attention_layernorm.weight"])
            g, c_g = self._lin(x2, layer, "gate_proj", use_lora)
            u, c_u = self._lin(x2, layer, "up_proj", use_lora)
            sg = 1.0 / (1.0 + np.exp(-g))
            m = g * sg * u
            d, c_d = self._lin(m, layer, "down_proj", use_lora)
            h = h + d
            caches.append((c_n1, c_q, c_k, c_v, qr, kr, v, p, c_o, c_n2, c_g, c_u, g, sg, u, c_d))
        xf, c_nf = self._rms(h, self.w["model.norm.weight"])
        logits = xf @ self.w["lm_head.weight"].T
        return logits, (ids, cos, sin, caches, c_nf, xf)

    def backward(self, dlogits, cache):
        """Gradients of every weight (and adapter) given dL/dlogits."""
        ids, cos, sin, caches, c_nf, xf = cache
        b, t = ids.shape
        hd, nh = self.head_dim, self.heads
        grads = {}
        flat = dlogits.reshape(-1, dlogits.shape[-1])
        grads["lm_head.weight"] = flat.T @ xf.reshape(-1, xf.shape[-1])
        dh, grads["model.norm.weight"] = self._rms_back(dlogits @ self.w["lm_head.weight"], c_nf)
        for layer in reversed(range(self.layers)):
            pre = f"model.layers.{layer}."
            (c_n1, c_q, c_k, c_v, qr, kr, v, p, c_o, c_n2, c_g, c_u, g, sg, u, c_d) = caches[layer]
            dm = self._lin_back(dh, c_d, layer, "down_proj", grads)
            dg = dm * u * sg * (1.0 + g * (1.0 - sg))
            du = dm * g * sg
            dx2 = self._lin_back(dg, c_g, layer, "gate_proj", grads)
            dx2 = dx2 + self._lin_back(du, c_u, layer, "up_proj", grads)
            dres, grads[pre + "post_attention_layernorm.weight"] = self._rms_back(dx2, c_n2)
            dh = dh + dres
            do = self._lin_back(dh, c_o, layer, "o_proj", grads).reshape(b, t, nh, hd)
            dp = np.einsum("bqhd,bkhd->bhqk", do, v)
            dv = np.einsum("bhqk,bqhd->bkhd", p, do)
            ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) / np.sqrt(hd)
            dqr = np.einsum("bhqk,bkhd->bqhd", ds, kr)
            dkr = np.einsum("bhqk,bqhd->bkhd", ds, qr)
            dq = (dqr * cos + self._rot_t(dqr * sin)).reshape(b, t, nh * hd)
            dk = (dkr * cos + self._rot_t(dkr * sin)).reshape(b, t, nh * hd)
            dx1 = self._lin_back(dq, c_q, layer, "q_proj", grads)
            dx1 = dx1 + self._lin_back(dk, c_k, layer, "k_proj", grads)
            dx1 = dx1 + self._lin_back(dv.reshape(b, t, nh * hd), c_v, layer, "v_proj", grads)
            dres, grads[pre + "input_layernorm.weight"] = self._rms_back(dx1, c_n1)
            dh = dh + dres
        demb = np.zeros_like(self.w["model.embed_tokens.weight"])
        np.add.at(demb, ids.reshape(-1), dh.reshape(-1, dh.shape[-1]))
        grads["model.embed_tokens.weight"] = demb
        return grads


def token_logps(logits, ids):
    """S[b,t] = log p(ids[b,t+1] | ids[b,:t+1]) and the softmax, for backward."""
    z = logits[:, :-1, :]
    z = z - z.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1, keepdims=True))
    logp = z - lse
    tgt = ids[:, 1:]
    s = np.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]
    return s, np.exp(logp)


def dlogits_from(ds, probs, ids):
    """dL/dlogits from dL/dS (S from token_logps)."""
    b, t1, v = probs.shape
    d = -ds[..., None] * probs
    onehot = np.zeros_like(probs)
    np.put_along_axis(onehot, ids[:, 1:, None], 1.0, axis=-1)
    d = d + ds[..., None] * onehot
    out = np.zeros((b, t1 + 1, v))
    out[:, :-1, :] = d
    return out


def logsig(x):
    return -np.logaddexp(0.0, -x)


def sig(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def log1mexp(a):
    return np.where(a < -np.log(2.0), np.log1p(-np.exp(a)), np.log(-np.expm1(a)))


def dpo_loss(s, ref_s, cmask, settings):
    """DPO loss (mean over pairs), dL/dS, per-pair logps and TRL's reward metrics."""
    n = s.shape[0] // 2
    beta = settings["beta"]
    e = settings.get("label_smoothing", 0.0)
    lt = settings["loss_type"]
    sums = (s * cmask).sum(axis=1)
    ref = (ref_s * cmask).sum(axis=1)
    pc, pr, rc, rr = sums[:n], sums[n:], ref[:n], ref[n:]
    z = beta * ((pc - rc) - (pr - rr))
    if lt == "sigmoid":
        per, dz = -logsig(z), -sig(-z)
    elif lt == "robust":
        per = (-(1 - e) * logsig(z) + e * logsig(-z)) / (1 - 2 * e)
        dz = (-(1 - e) * sig(-z) - e * sig(z)) / (1 - 2 * e)
    elif lt == "cdpo":
        per = -(1 - e) * logsig(z) - e * logsig(-z)
        dz = -(1 - e) * sig(-z) + e * sig(z)
    elif lt == "ipo":
        nc, nr = cmask[:n].sum(axis=1), cmask[n:].sum(axis=1)
        x = (pc - rc) / nc - (pr - rr) / nr - 1.0 / (2.0 * beta)
        per = x * x
        dpc, dpr = 2.0 * x / nc, -2.0 * x / nr
    else:
        raise ValueError(f"unknown DPO loss type {lt!r}")
    if lt != "ipo":
        dpc, dpr = beta * dz, -beta * dz
    dsum = np.concatenate([dpc, dpr]) / n
    cr, rj = beta * (pc - rc), beta * (pr - rr)
    metrics = {
        "rewards/chosen": float(cr.mean()),
        "rewards/rejected": float(rj.mean()),
        "rewards/accuracies": float((cr > rj).mean()),
        "rewards/margins": float((cr - rj).mean()),
        "logps/chosen": float(pc.mean()),
        "logps/rejected": float(pr.mean()),
    }
    logps = {"chosen_logps": pc, "rejected_logps": pr, "ref_chosen_logps": rc, "ref_rejected_logps": rr}
    return float(per.mean()), dsum[:, None] * cmask, logps, metrics


def orpo_loss(s, cmask, amask, beta):
    """ORPO (TRL's): NLL of the chosen rows over every non-pad token after the first (prompt
    included) minus beta mean(logsigmoid(log_odds)) of the per-token mean completion log-probs."""
    n = s.shape[0] // 2
    nmask = amask[:n, 1:].astype(np.float64)
    cnt = cmask.sum(axis=1)
    a = (s * cmask).sum(axis=1) / cnt
    ac, ar = a[:n], a[n:]
    lo = (ac - ar) - (log1mexp(ac) - log1mexp(ar))
    ratio = logsig(lo)
    nll = -(s[:n] * nmask).sum() / nmask.sum()
    loss = nll - beta * ratio.mean()
    dlo = -beta * sig(-lo) / n
    da = np.concatenate([dlo / (1.0 - np.exp(ac)), -dlo / (1.0 - np.exp(ar))])
    ds = (da / cnt)[:, None] * cmask
    ds[:n] += -nmask / nmask.sum()
    cr, rj = beta * ac, beta * ar
    metrics = {
        "nll_loss": float(nll),
        "log_odds_ratio": float(ratio.mean()),
        "log_odds_chosen": float(lo.mean()),
        "rewards/chosen": float(cr.mean()),
        "rewards/rejected": float(rj.mean()),
        "rewards/accuracies": float((cr > rj).mean()),
        "rewards/margins": float((cr - rj).mean()),
        "logps/chosen": float(ac.mean()),
        "logps/rejected": float(ar.mean()),
    }
    return float(loss), ds, {"chosen_logps": ac, "rejected_logps": ar}, metrics


def adamw_step(params, grads, state, lr, betas, eps, weight_decay):
    """torch.optim.AdamW's update (one call = one step) in float64; returns the new values."""
    b1, b2 = betas
    state["step"] = state.get("step", 0) + 1
    k = state["step"]
    out = {}
    for n, p in params.items():
        m = state.setdefault("m." + n, np.zeros_like(p))
        v = state.setdefault("v." + n, np.zeros_like(p))
        g = grads[n]
        p = p * (1.0 - lr * weight_decay)
        m[...] = b1 * m + (1.0 - b1) * g
        v[...] = b2 * v + (1.0 - b2) * g * g
        denom = np.sqrt(v) / np.sqrt(1.0 - b2**k) + eps
        out[n] = p - (lr / (1.0 - b1**k)) * m / denom
    return out
