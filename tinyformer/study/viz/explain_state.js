// The explain page (see explain_namespace.js), the view selected (attention, layer, head, gradient,
// token, query row) and the URL hash that holds it.
(function (page) {
  "use strict";
  const { data, KINDS, STEPS, GRADS, outputs, tokenIndex, block } = page;
  const sensitive = page.view.check.head; // at first, the most sensitive head (of the step shown first)
  const state = { kind: sensitive.kind, layer: sensitive.layer, head: sensitive.head, grad: "dP", token: 0, row: 0 };
  // Reads the hash into `state`; returns the index in STEPS of its step= (the step shown if none).
  function readHash() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    const kind = params.get("kind");
    if (KINDS.indexOf(kind) >= 0) state.kind = kind;
    const info = data.kinds[state.kind];
    const whole = function (name, low, high) {
      const v = Number(params.get(name));
      return params.has(name) && Number.isInteger(v) && v >= low && v <= high ? v : null;
    };
    state.layer = whole("layer", 1, info.layers) || Math.min(state.layer, info.layers);
    state.head = whole("head", 1, info.heads) || Math.min(state.head, info.heads);
    if (GRADS[params.get("grad")]) state.grad = params.get("grad");
    state.token = params.get("token") === "all" ? 0 : whole("token", 1, outputs.length) || state.token;
    state.row = whole("row", 1, info.rows) || 0;
    const step = STEPS.map(function (s) { return String(s.step); }).indexOf(params.get("step"));
    return step >= 0 ? step : page.current;
  }
  function writeHash() {
    const text = "kind=" + state.kind + "&layer=" + state.layer + "&head=" + state.head + "&grad=" + state.grad +
      (state.token ? "&token=" + state.token : "") + (state.row ? "&row=" + state.row : "") +
      (STEPS.length > 1 ? "&step=" + page.view.step : "");
    try {
      history.replaceState(null, "", "#" + text);
    } catch (error) {
      location.hash = text;
    }
  }
  function select(changes) {
    Object.assign(state, changes);
    const info = data.kinds[state.kind];
    state.layer = Math.min(state.layer, info.layers);
    state.head = Math.min(state.head, info.heads);
    if (state.row > info.rows) state.row = 0;
    writeHash();
    page.update();
  }

  // The gradient `grad` ("dP" or "dS") of the current source (whole loss or token) at (kind, layer, head),
  // or null when the page does not hold that token's own gradients.
  function gradient(grad, kind, layer, head, token) {
    if (!token) return block(grad + "." + kind, [layer - 1, head - 1]);
    if (!(token in tokenIndex)) return null;
    return block("token." + grad + "." + kind, [tokenIndex[token], layer - 1, head - 1]);
  }
  function probabilities(kind, layer, head) { return block("P." + kind, [layer - 1, head - 1]); }
  function sourceName(token) {
    return token ? "ℓ" + token + " (the loss of y" + token + " = " + outputs[token - 1] + ")" : "the whole loss L";
  }
  Object.assign(page, { state: state, readHash: readHash, writeHash: writeHash, select: select,
    gradient: gradient, probabilities: probabilities, sourceName: sourceName });
})(window.tinyformerExplain);
