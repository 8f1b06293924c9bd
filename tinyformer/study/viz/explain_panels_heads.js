// The explain page (see explain_namespace.js), the header, the controls and the panels of the
// heads: 1, every layer and head, and 2, one head's P and gradient (with its export and tooltip).
(function (page) {
  "use strict";
  const { data, KINDS, STEPS, GRADS, outputs, rowLabels, colLabels, fmt, maxAbs, Figure, place, isLarge,
    labelledHeatmap, state, select, gradient, probabilities, sourceName } = page;
  // ------------------------------------------------------------------ header and controls
  function summary() {
    const m = data.model;
    const depth = m.decoder_layers === undefined || m.decoder_layers === m.layers ? m.layers + " layers" :
      m.layers + " encoder and " + m.decoder_layers + " decoder layers";
    document.getElementById("summary").textContent = "Model: " + depth + ", d_model " + m.d_model +
      ", " + m.heads + " heads (d_k " + m.d_k + "), d_ff " + m.d_ff + ", vocabulary " + m.vocabulary + ", " +
      m.parameters.toLocaleString("en") + " parameters. Target " + (data.target.decoding ?
      "translated by the model (" + data.target.decoding + ")" : "given as a reference") +
      ", teacher-forced: L = Σₜ −log p(yₜ | y₍<t₎, x) = " + fmt(page.view.loss.total) + " over " + outputs.length +
      " target tokens (no label smoothing)." + (STEPS.length > 1 ? " Step " + page.view.step + " of the run (" +
      page.view.checkpoint + ")." : "");
  }
  function header() {
    document.getElementById("target-label").textContent = data.target.given;
    summary();
    document.getElementById("about").textContent = data.generator + " · data schema " + data.schema + " version " +
      data.version + " (the JSON in the element explain-data: P, Q, K, V, dO of every head as float16 scaled per head, " +
      "each token's dℓₜ/dP in one byte a value, the rest float32; this page computes dP, dS, dQ, dK, dV from them " +
      "in float64) · " +
      "offline by construction: its Content-Security-Policy forbids every request.";
    const buttons = document.getElementById("kind-buttons");
    KINDS.forEach(function (kind) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "kind";
      button.dataset.kind = kind;
      button.textContent = data.kinds[kind].name;
      button.addEventListener("click", function () { select({ kind: kind }); });
      buttons.appendChild(button);
    });
    document.getElementById("layer-select").addEventListener("change", function (e) {
      select({ layer: Number(e.target.value) });
    });
    document.getElementById("head-select").addEventListener("change", function (e) {
      select({ head: Number(e.target.value) });
    });
    document.querySelectorAll('input[name="grad"]').forEach(function (input) {
      input.addEventListener("change", function () { select({ grad: input.value }); });
    });
    document.getElementById("export-svg").addEventListener("click", function () {
      download(new Blob([exportSVG()], { type: "image/svg+xml" }), exportName("svg"));
    });
    document.getElementById("export-png").addEventListener("click", function () {
      exportCanvas().toBlob(function (blob) { download(blob, exportName("png")); }, "image/png");
    });
  }
  function controls() {
    document.querySelectorAll("button.kind").forEach(function (b) {
      b.setAttribute("aria-pressed", String(b.dataset.kind === state.kind));
    });
    const info = data.kinds[state.kind];
    [["layer-select", info.layers, state.layer], ["head-select", info.heads, state.head]].forEach(function (s) {
      const element = document.getElementById(s[0]);
      if (element.options.length !== s[1]) {
        element.textContent = "";
        for (let i = 1; i <= s[1]; i++) element.add(new Option(String(i), String(i)));
      }
      element.value = String(s[2]);
    });
    document.querySelectorAll('input[name="grad"]').forEach(function (input) { input.checked = input.value === state.grad; });
  }

  // ------------------------------------------------------------------ 1. overview
  function overview() {
    const container = document.getElementById("overview");
    KINDS.forEach(function (kind) {
      const info = data.kinds[kind];
      const section = document.createElement("div");
      section.className = "kind-block";
      const title = document.createElement("h3");
      title.textContent = info.name + ": " + info.layers + " layers × " + info.heads + " heads, " + info.rows +
        " queries (" + info.queries + ") × " + info.cols + " keys (" + info.keys + ")";
      section.appendChild(title);
      const grid = document.createElement("div");
      grid.className = "grid";
      grid.style.gridTemplateColumns = "repeat(" + info.heads + ", max-content)";
      const cell = Math.max(1, Math.min(6, Math.floor(120 / Math.max(info.rows, info.cols))));
      for (let layer = 1; layer <= info.layers; layer++) {
        for (let head = 1; head <= info.heads; head++) {
          const wrap = document.createElement("div");
          wrap.className = "thumb-wrap";
          Object.assign(wrap.dataset, { kind: kind, layer: layer, head: head });
          const figure = new Figure(info.cols * cell, info.rows * cell);
          figure.heatmap(0, 0, cell, { rows: info.rows, cols: info.cols, values: probabilities(kind, layer, head),
            scale: "sequential", vmax: 1, quantity: "P" });
          const holder = document.createElement("div");
          const element = place(holder, figure, isLarge(info.rows, info.cols), "");
          element.classList.add("thumb");
          Object.assign(element.dataset, { kind: kind, layer: layer, head: head, rows: info.rows, cols: info.cols });
          wrap.appendChild(element);
          const caption = document.createElement("span");
          caption.textContent = "layer " + layer + ", head " + head;
          wrap.appendChild(caption);
          wrap.addEventListener("click", function () { select({ kind: kind, layer: layer, head: head }); });
          wrap.addEventListener("mousemove", function (event) {
            const box = element.getBoundingClientRect();
            const hit = figure.hit(event.clientX - box.left, event.clientY - box.top);
            if (hit) showTip(event, cellText(kind, layer, head, hit.r, hit.c));
          });
          wrap.addEventListener("mouseleave", hideTip);
          grid.appendChild(wrap);
        }
      }
      section.appendChild(grid);
      container.appendChild(section);
    });
  }
  function markOverview() {
    document.querySelectorAll(".thumb-wrap").forEach(function (wrap) {
      const on = wrap.dataset.kind === state.kind && Number(wrap.dataset.layer) === state.layer &&
        Number(wrap.dataset.head) === state.head;
      wrap.classList.toggle("selected", on);
    });
  }

  // ------------------------------------------------------------------ tooltip
  const tip = document.getElementById("tooltip");
  function showTip(event, text) {
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = (event.pageX + 14) + "px";
    tip.style.top = (event.pageY + 14) + "px";
  }
  function hideTip() { tip.hidden = true; }
  function cellText(kind, layer, head, r, c) {
    const i = r * data.kinds[kind].cols + c;
    const lines = [data.kinds[kind].name + ", layer " + layer + ", head " + head,
      "query " + (r + 1) + " " + JSON.stringify(rowLabels(kind)[r]) + " → key " + (c + 1) + " " +
      JSON.stringify(colLabels(kind)[c]), "P = " + fmt(probabilities(kind, layer, head)[i])];
    ["dP", "dS"].forEach(function (grad) {
      const values = gradient(grad, kind, layer, head, state.token);
      lines.push(GRADS[grad] + " = " + (values ? fmt(values[i]) : "not in this page") +
        (state.token ? " (of ℓ" + state.token + ")" : ""));
    });
    return lines.join("\n");
  }

  // ------------------------------------------------------------------ 2. one head
  let detailFigure = null;
  function detailLayout(forExport) {
    const kind = state.kind, info = data.kinds[kind];
    const cell = Math.max(3, Math.min(22, Math.floor(360 / Math.max(info.rows, info.cols))));
    const probs = probabilities(kind, state.layer, state.head);
    const grads = gradient(state.grad, kind, state.layer, state.head, state.token);
    const figure = new Figure(1, 1);
    const name = info.name + ", layer " + state.layer + ", head " + state.head;
    if (forExport) figure.text(4, 14, name + "; gradient of " + sourceName(state.token), { size: 12 });
    const top = forExport ? 22 : 0;
    const first = labelledHeatmap(figure, 4, top, { title: "P", rows: info.rows, cols: info.cols, values: probs,
      scale: "sequential", vmax: 1, quantity: "P", cell: cell, rowLabels: rowLabels(kind), colLabels: colLabels(kind) });
    let width = 4 + first.width, height = top + first.height;
    const heatmaps = [first.item];
    if (grads) {
      const vmax = maxAbs(grads) || 1;
      const second = labelledHeatmap(figure, width + 28, top, { title: GRADS[state.grad] + " of " +
        (state.token ? "ℓ" + state.token : "L") + " (±" + fmt(vmax) + ")", rows: info.rows, cols: info.cols,
        values: grads, scale: "diverging", vmax: vmax, quantity: "grad", cell: cell, rowLabels: null,
        colLabels: colLabels(kind) });
      width += 28 + second.width;
      height = Math.max(height, top + second.height);
      heatmaps.push(second.item);
    }
    if (state.row) { // the derivation's query row
      heatmaps.forEach(function (item) {
        figure.outline(item.x - 1, item.y + (state.row - 1) * cell - 1, item.cols * cell + 2, cell + 2, "#f28e2b");
      });
    }
    figure.width = Math.ceil(width + 8);
    figure.height = Math.ceil(height + 4);
    return figure;
  }
  function detail() {
    const info = data.kinds[state.kind];
    const grads = gradient(state.grad, state.kind, state.layer, state.head, state.token);
    document.getElementById("detail-note").textContent = info.name + ", layer " + state.layer + ", head " +
      state.head + ": rows are the queries (" + info.queries + "), columns the keys (" + info.keys + "). Left P; right " +
      GRADS[state.grad] + " of " + sourceName(state.token) + " on a diverging scale (blue negative, red positive)" +
      (state.grad === "dS" ? ", the softmax's backward dS = P∘(dP − rowsum(P∘dP)) from the hook point's P and dP;" +
        " every row sums to 0." : ", the gradient at the keep_attention hook point, dP = dO·Vᵀ.") +
      (grads ? "" : " The page does not hold this token's own dL/dP and dL/dS (see section 3).");
    const container = document.getElementById("detail");
    detailFigure = detailLayout(false);
    const element = place(container, detailFigure, isLarge(info.rows, info.cols), "");
    element.id = "detail-view";
    Object.assign(element.dataset, { kind: state.kind, layer: state.layer, head: state.head, grad: state.grad,
      token: state.token, rows: info.rows, cols: info.cols });
  }
  function detailEvents() {
    const container = document.getElementById("detail");
    function hitOf(event) {
      const view = document.getElementById("detail-view");
      if (!view || !detailFigure) return null;
      const box = view.getBoundingClientRect();
      return detailFigure.hit(event.clientX - box.left, event.clientY - box.top);
    }
    container.addEventListener("mousemove", function (event) {
      const hit = hitOf(event);
      if (hit) showTip(event, cellText(state.kind, state.layer, state.head, hit.r, hit.c));
      else hideTip();
    });
    container.addEventListener("mouseleave", hideTip);
    container.addEventListener("click", function (event) {
      const hit = hitOf(event);
      if (hit) select({ row: hit.r + 1 });
    });
  }


  // ------------------------------------------------------------------ export of the current view
  function exportName(suffix) {
    return "tinyformer-explain-" + state.kind + "-layer" + state.layer + "-head" + state.head + "-" + state.grad +
      (state.token ? "-token" + state.token : "") + "." + suffix;
  }
  function exportSVG() {
    const holder = document.createElement("div");
    holder.innerHTML = detailLayout(true).toSVG('class="heatmap export"');
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(holder.firstElementChild);
  }
  function exportCanvas() {
    const canvas = document.createElement("canvas");
    detailLayout(true).draw(canvas);
    return canvas;
  }
  function download(blob, name) {
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = name;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(function () { URL.revokeObjectURL(link.href); }, 1000);
  }
  Object.assign(page, { summary: summary, header: header, controls: controls, overview: overview,
    markOverview: markOverview, showTip: showTip, hideTip: hideTip, detail: detail, detailEvents: detailEvents,
    exportSVG: exportSVG, exportCanvas: exportCanvas });
})(window.tinyformerExplain);
