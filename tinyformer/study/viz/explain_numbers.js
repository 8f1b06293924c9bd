// The explain page (see explain_namespace.js), the numbers its panels read: the stored arrays of
// the step shown, and what the page derives from them in float64 (P's rows normalised, dP, dS,
// dQ, dK, dV and each token's dS), each block computed once a step, when first read.
(function (page) {
  "use strict";
  const { data, STEPS, bytesOf, decodeArray, matmulT, matmulTA, transpose, softmaxBackward } = page;
  // A page of several checkpoints of one run (`tinyformer explain --checkpoints`) holds what changes
  // with training (the loss, the token gradients, the check, the arrays and samples) once per step in
  // data.steps, and what does not (tokens, shapes, the model) once. A page of one checkpoint is its
  // own only step. `view` is the step shown; the slider changes it.
  let current = STEPS.length - 1, view = STEPS[current];
  const tokenPositions = view.token_gradients.positions.map(function (t) { return t - 1; });
  let arrays = {};

  // The contiguous block of a stored array `name` at the leading indices `index` (all of it for []).
  function slice(array, index, field) {
    let offset = 0;
    index.forEach(function (i, axis) { offset += i * array.strides[axis]; });
    const size = index.length ? array.strides[index.length - 1] : array[field].length;
    return array[field].subarray(offset, offset + size);
  }
  function stored(name, index) { return slice(arrays[name], index, "values"); }
  function storedError(name, index) { return slice(arrays[name], index, "error"); }

  // P of a head as the page computes with it: each stored row divided by its sum (float16 rows sum
  // to 1 only to their precision; explain_codec.normalised_rows).
  let derived = {};
  const stepArrays = [], stepDerived = [];
  // Show step k's numbers: its arrays decoded once, when first shown, and its own computed blocks.
  function useStep(k) {
    current = k;
    view = STEPS[k];
    if (!stepArrays[k]) {
      const decoded = {};
      for (const name of Object.keys(view.arrays)) {
        decoded[name] = decodeArray(view.arrays[name], tokenPositions, bytesOf(view.arrays[name]));
      }
      stepArrays[k] = decoded;
      stepDerived[k] = {};
    }
    arrays = stepArrays[k];
    derived = stepDerived[k];
  }
  function cached(key, make) { return derived[key] || (derived[key] = make()); }
  function probabilitiesOf(kind, l, h) {
    return cached("P." + kind + "." + l + "." + h, function () {
      const info = data.kinds[kind], raw = stored("P." + kind, [l, h]), out = new Float64Array(raw.length);
      for (let i = 0; i < info.rows; i++) {
        let s = 0;
        for (let j = 0; j < info.cols; j++) s += raw[i * info.cols + j];
        for (let j = 0; j < info.cols; j++) out[i * info.cols + j] = s > 0 ? raw[i * info.cols + j] / s : 0;
      }
      return out;
    });
  }
  function headGradient(name, kind, l, h) {
    return cached(name + "." + kind + "." + l + "." + h, function () {
      const info = data.kinds[kind], dk = data.model.d_k, rows = info.rows, cols = info.cols;
      if (name === "dP") return matmulT(stored("dO." + kind, [l, h]), stored("V." + kind, [l, h]), rows, cols, dk);
      const scale = 1 / Math.sqrt(dk), P = probabilitiesOf(kind, l, h);
      const dS = softmaxBackward(P, headGradient("dP", kind, l, h), rows, cols);
      if (name === "dS") return dS;
      if (name === "dV") return matmulTA(P, stored("dO." + kind, [l, h]), rows, cols, dk);
      const out = name === "dQ" ? matmulTA(transpose(dS, rows, cols), stored("K." + kind, [l, h]), cols, rows, dk)
        : matmulTA(dS, stored("Q." + kind, [l, h]), rows, cols, dk);
      for (let i = 0; i < out.length; i++) out[i] *= scale;
      return out;
    });
  }
  function tokenGradient(name, kind, ti, l, h) {
    if (name === "dP") return stored("token.dP." + kind, [ti, l, h]);
    return cached("token.dS." + kind + "." + ti + "." + l + "." + h, function () {
      const info = data.kinds[kind];
      return softmaxBackward(probabilitiesOf(kind, l, h), stored("token.dP." + kind, [ti, l, h]), info.rows, info.cols);
    });
  }
  // What the panels read: `name` at the leading indices `index`. P, dP, dS, dQ, dK, dV at [layer, head]
  // and token.dP, token.dS at [token index, layer, head] are the page's own; the rest is stored.
  const DERIVED = { dP: 1, dS: 1, dQ: 1, dK: 1, dV: 1 };
  function block(name, index) {
    const [quantity, kind] = name.split(".");
    if (quantity === "P") return probabilitiesOf(kind, index[0], index[1]);
    if (quantity in DERIVED) return headGradient(quantity, kind, index[0], index[1]);
    if (quantity === "token" && (kind === "dP" || kind === "dS")) {
      return tokenGradient(kind, name.split(".")[2], index[0], index[1], index[2]);
    }
    return stored(name, index);
  }
  // Every head of `name` (P, dP, ... or token.dP, token.dS) in one array, as the Python side's.
  function whole(name) {
    const parts = name.split("."), token = parts[0] === "token", kind = parts[parts.length - 1];
    const info = data.kinds[kind], tokens = token ? tokenPositions.length : 1, out = [];
    for (let t = 0; t < tokens; t++) {
      for (let l = 0; l < info.layers; l++) {
        for (let h = 0; h < info.heads; h++) out.push(token ? block(name, [t, l, h]) : block(name, [l, h]));
      }
    }
    const size = out.reduce(function (s, a) { return s + a.length; }, 0), all = new Float64Array(size);
    let offset = 0;
    out.forEach(function (a) { all.set(a, offset); offset += a.length; });
    return all;
  }

  const pieces = { source: data.source.pieces, target: data.target.inputs };
  const outputs = data.target.outputs;
  const rowLabels = function (kind) { return pieces[data.kinds[kind].queries]; };
  const colLabels = function (kind) { return pieces[data.kinds[kind].keys]; };
  const tokenIndex = {}; // target position (1-based) -> index in the token.* arrays
  view.token_gradients.positions.forEach(function (t, i) { tokenIndex[t] = i; });
  // The step shown changes through useStep alone: the other scripts read it, as page.current
  // (its index in STEPS), page.view (its data) and page.arrays (its stored arrays, decoded).
  Object.defineProperties(page, {
    current: { get: function () { return current; } },
    view: { get: function () { return view; } },
    arrays: { get: function () { return arrays; } },
  });
  Object.assign(page, { tokenPositions: tokenPositions, useStep: useStep, cached: cached, stored: stored,
    storedError: storedError, probabilitiesOf: probabilitiesOf, headGradient: headGradient,
    tokenGradient: tokenGradient, block: block, whole: whole, pieces: pieces, outputs: outputs,
    rowLabels: rowLabels, colLabels: colLabels, tokenIndex: tokenIndex });
})(window.tinyformerExplain);
