"""Recovery: rebuild the shared SFT's training checkpoint from its committed .vla bundle (this CPU trains a
different SFT from the same seed). Each parameter of a template checkpoint (same config) is matched to the
template's own bundle tensor (by value, or transposed), then read from the old bundle at the same tensor name;
the rebuilt model's export must reproduce the old bundle's weights byte for byte."""

import io
import sys
import zipfile

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from learner.model.checkpoints import load_vla
from learner.model.export import export_bundle


def tensors(bundle):
    z = zipfile.ZipFile(bundle)
    weights = z.read("weights.bin")
    out = {}
    for graph in ("encoder.onnx", "prefill.onnx", "decode.onnx"):
        m = onnx.load(io.BytesIO(z.read(graph)), load_external_data=False)
        for init in m.graph.initializer:
            loc = {e.key: e.value for e in init.external_data}
            if "offset" in loc:
                dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
                a = np.frombuffer(
                    weights,
                    dtype=dtype,
                    count=int(loc["length"]) // np.dtype(dtype).itemsize,
                    offset=int(loc["offset"]),
                ).reshape(list(init.dims))
            else:
                a = numpy_helper.to_array(init)
            out[f"{graph}:{init.name}"] = a
    out["wte.npy"] = np.load(io.BytesIO(z.read("wte.npy")))
    return out


template_ckpt, template_bundle, old_bundle, out_ckpt = sys.argv[1:5]
state = torch.load(template_ckpt, map_location="cpu", weights_only=True)
new, old = tensors(template_bundle), tensors(old_bundle)
restored, unmatched = {}, []
for name, p in state["model"].items():
    a = p.numpy()
    hit = None
    for key, t in new.items():
        if t.shape == a.shape and np.array_equal(t, a):
            hit = (key, False)
            break
        if a.ndim == 2 and t.shape == a.T.shape and np.array_equal(t, a.T):
            hit = (key, True)
    if hit is None:
        unmatched.append((name, tuple(a.shape)))
        continue
    key, transposed = hit
    value = old[key].T if transposed else old[key]
    restored[name] = torch.from_numpy(np.ascontiguousarray(value).copy()).to(p.dtype)
# pos_scale is folded with the token embeddings into the encoder's one position constant: solve for it.
if unmatched == [("encoder.pos_scale", ())]:
    from learner.model.vla import patch_positions

    model, _, _ = load_vla(template_ckpt)
    enc = model.encoder
    wte = torch.nn.Embedding.from_pretrained(restored["encoder.wte.weight"])
    positions = patch_positions(wte, enc.x_ids, enc.y_ids).detach().numpy()
    folded = [t for k, t in old.items() if k.startswith("encoder.onnx:onnx::Add") and t.shape == positions.shape][0]
    ratio = folded[np.abs(positions) > 1e-3] / positions[np.abs(positions) > 1e-3]
    print("pos_scale ratio spread", ratio.min(), ratio.max())
    restored["encoder.pos_scale"] = torch.tensor(float(np.median(ratio)), dtype=torch.float32)
    unmatched = []
print("unmatched:", unmatched)
if unmatched:
    sys.exit(1)
state["model"] = restored
torch.save(state, out_ckpt)
model, tok, pruning = load_vla(out_ckpt)
export_bundle(model, tok, pruning, "/tmp/restored.vla")
same = zipfile.ZipFile("/tmp/restored.vla").read("weights.bin") == zipfile.ZipFile(old_bundle).read("weights.bin")
same_wte = zipfile.ZipFile("/tmp/restored.vla").read("wte.npy") == zipfile.ZipFile(old_bundle).read("wte.npy")
print("weights.bin identical:", same, "wte identical:", same_wte)
