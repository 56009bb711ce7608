"""One log-prob pass, its loss and backward on a tiny model with a long real video, in one process or under
``torchrun`` with every rank in one sequence-parallel group (tests/test_sequence_parallel.py).

``python sequence_parallel_probe.py FAMILY VIDEO OUT``: writes ``OUT`` (rank 0) with the per-token log-probs,
entropies, the loss and every parameter's gradient summed over the ranks (each rank of a group holds the gradient
of its slice's tokens; their sum is the whole gradient).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from probe_exit import leave

from mmrl.engine import distributed
from mmrl.model import MediaInput, RankBinding, TokenSeq, load_policy
from mmrl.toy.tiny_models import ensure_tiny
from video import sample_video


def patch_of(family: str) -> int:
    return 16 if family.startswith("qwen3") else 14


def batch(policy, family: str, video: Path) -> list[TokenSeq]:
    """Two answers to a question on the long video and an image, and a text-only question."""
    import numpy as np
    from PIL import Image

    f = 2 * patch_of(family)
    data = sample_video(video, "qwen", nframes=64, min_pixels=4 * f * f, max_pixels=4 * f * f,
                        image_patch_size=patch_of(family))
    assert len(data.indices) >= 64, len(data.indices)
    vid = MediaInput(key="long", kind="video", data=data, timestamps=list(data.timestamps))
    arr = np.zeros((2 * f, 3 * f, 3), np.uint8)
    arr[...] = (40, 200, 90)
    arr[:, ::5] = (250, 10, 10)
    img = MediaInput(key="img", kind="image", data=Image.fromarray(arr))
    content = [{"type": "video"}, {"type": "image"}, {"type": "text", "text": "What moves, and where?"}]
    prompt = policy.encode(policy.render([{"role": "user", "content": content}]), [vid, img])
    g = torch.Generator().manual_seed(0)
    seqs = [prompt.extend(torch.randint(100, 300, (n,), generator=g).tolist(), trained=True) for n in (7, 12)]
    ids = policy.tokenizer("A question with no media at all.")["input_ids"]
    seqs.append(TokenSeq(ids=ids, mm_types=[0] * len(ids)).extend([120, 130, 140], trained=True))
    return seqs


def main() -> None:
    family, video, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    world = distributed.init("cpu")
    policy = load_policy(ensure_tiny(family), device="cpu", attn_implementation="varlen")
    policy.model.train()
    group = world.sequence_group(world.size) if world.active else None
    policy.bind_ranks(RankBinding(sequence_group=group))
    seqs = batch(policy, family, video)
    logp, ent, mask = policy.forward_logprobs(seqs, with_entropy=True)
    weights = torch.linspace(-1.0, 1.0, mask.numel()).view(mask.shape)
    n = mask.sum()
    loss = -(logp * weights * mask).sum() / n - 0.05 * (ent * mask).sum() / n
    loss.backward()
    grads = {}
    for name, p in policy.model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[name] = world.sum_(g.detach().clone())
    if world.is_main:
        torch.save({"logp": logp.detach(), "ent": ent.detach(), "mask": mask, "loss": loss.detach(),
                    "grads": grads, "tokens": sum(len(s) for s in seqs),
                    "video_tokens": sum(t == policy.video_token_id for t in seqs[0].ids)}, out)
    leave()  # every rank has done its work: the group left, the process ended (tests/probe_exit.py)


if __name__ == "__main__":
    main()
