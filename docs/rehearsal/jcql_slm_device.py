"""Throughput of JCQL's KBC SLM at the `full` profile's size on one device (issue 23 item 4: a bill for the non-LLM GPU work).

Standalone on purpose (only torch and transformers): the GPU machine this runs on has no kgrag_nb dependencies. The model is
`kgrag_nb.studies.jcql.kbc._new_model` with studies.yaml's full `slm` (T5: d_model 512, d_ff 2048, 6+6 layers, 8 heads, d_kv 64,
vocab 32,000, tied embeddings, no dropout); training is `train_kbc`'s step (Adafactor, fixed lr 1e-3, batch 64, §4.1);
scoring is the R-sample filtered ranking's teacher-forced log-likelihood of R = 500 candidate tails per query.
Token lengths are those of FB15k-237 KBC examples (head + relation ~16 tokens in, tail name ~8 out): synthetic ids,
since throughput does not depend on which ids they are.

    python docs/rehearsal/jcql_slm_device.py --device cuda --seconds 60 --out result.json
"""
import argparse, json, platform, time

import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers.optimization import Adafactor

FULL_SLM = dict(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8, d_kv=64, vocab_size=32000)


def model(device):
    c = T5Config(**FULL_SLM, dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=True)
    return T5ForConditionalGeneration(c).to(device)


def batch(n, src_len=16, tgt_len=8, device="cpu", g=None):
    x = torch.randint(2, FULL_SLM["vocab_size"], (n, src_len), generator=g)
    y = torch.randint(2, FULL_SLM["vocab_size"], (n, tgt_len), generator=g)
    return x.to(device), y.to(device)


def sync(device):
    if device.startswith("cuda"): torch.cuda.synchronize()


def train_rate(device, seconds, batch_size=64, amp=False):
    torch.manual_seed(0); g = torch.Generator().manual_seed(0)
    m = model(device); m.train()
    opt = Adafactor(m.parameters(), lr=1e-3, relative_step=False, scale_parameter=False, warmup_init=False)
    data = [batch(batch_size, device=device, g=g) for _ in range(16)]
    def step(i):
        x, y = data[i % len(data)]
        opt.zero_grad()
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=amp):
            loss = m(input_ids=x, labels=y).loss
        loss.backward(); opt.step()
    for i in range(3): step(i)  # warm-up (kernels, allocator)
    sync(device); t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        step(n); n += 1
    sync(device)
    return n * batch_size / (time.perf_counter() - t0)


@torch.no_grad()
def score_rate(device, seconds, R=500, amp=False):
    torch.manual_seed(0); g = torch.Generator().manual_seed(1)
    m = model(device); m.eval()
    x, y = batch(R, device=device, g=g)
    def one():
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=amp):
            logits = m(input_ids=x, labels=y).logits
        return torch.log_softmax(logits.float(), -1).gather(-1, y.unsqueeze(-1)).sum()
    one(); sync(device); t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        one(); n += 1
    sync(device)
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds per measurement")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    res = dict(device=a.device, name=torch.cuda.get_device_name(0) if a.device.startswith("cuda") else platform.processor() or platform.machine(),
               torch=torch.__version__, threads=torch.get_num_threads(), seconds=a.seconds,
               parameters=sum(p.numel() for p in model("cpu").parameters()), slm=FULL_SLM)
    for amp in ([False, True] if a.device.startswith("cuda") else [False]):
        tag = "bf16" if amp else "fp32"
        res[f"train_examples_per_s_{tag}"] = train_rate(a.device, a.seconds, amp=amp)
        res[f"score_queries_per_s_R500_{tag}"] = score_rate(a.device, a.seconds, amp=amp)
        print(tag, {k: round(v, 1) for k, v in res.items() if k.endswith(tag)}, flush=True)
    print(json.dumps(res))
    if a.out:
        with open(a.out, "w") as f: json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
