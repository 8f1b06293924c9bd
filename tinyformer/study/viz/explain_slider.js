// The explain page (see explain_namespace.js), a run's steps (`tinyformer explain --checkpoints`):
// panel 0 across training, the slider and ← → that show a step in every panel, and their check.
(function (page) {
  "use strict";
  const { data, STEPS, tokenPositions, bytesOf, decodeArray, useStep, fmt, escapeText, state, writeHash,
    summary, overview, rolloutPanel, gradientCheck } = page;
  function stepSlider() {
    if (STEPS.length < 2) return;
    const slider = document.getElementById("step-slider");
    document.getElementById("step-field").hidden = false;
    document.getElementById("steps-section").hidden = false;
    slider.max = String(STEPS.length - 1);
    slider.value = String(page.current);
    slider.addEventListener("input", function () { setStep(Number(slider.value)); });
    document.addEventListener("keydown", function (event) { // ← → anywhere but in a form control
      const tag = (event.target && event.target.tagName || "").toLowerCase();
      if (tag === "input" || tag === "select" || tag === "textarea" || event.altKey || event.ctrlKey || event.metaKey) return;
      const shown = page.current, k = event.key === "ArrowLeft" ? shown - 1 : event.key === "ArrowRight" ? shown + 1 : -1;
      if (k >= 0 && k < STEPS.length) {
        event.preventDefault();
        setStep(k);
      }
    });
    document.getElementById("steps-chart").addEventListener("click", function (event) {
      const k = event.target.getAttribute && event.target.getAttribute("data-index");
      if (k !== null && k !== undefined) setStep(Number(k));
    });
  }
  // Every panel follows the step: what depends on it is drawn again.
  function setStep(k) {
    useStep(k);
    stepPanels();
    writeHash();
    page.update();
  }
  function stepPanels() {
    if (STEPS.length < 2) return;
    document.getElementById("step-slider").value = String(page.current);
    document.getElementById("step-label").textContent = "step " + page.view.step + " (" + (page.current + 1) +
      " of " + STEPS.length + ")";
    document.body.dataset.step = String(page.view.step);
    summary();
    ["overview", "rollout", "check", "tokens"].forEach(function (id) { document.getElementById(id).textContent = ""; });
    overview();
    rolloutPanel();
    gradientCheck();
  }
  const stepSensitivity = {}; // "k.kind": (layers·heads) of step k, decoded apart from its other arrays
  function sensitivityAt(k, kind) {
    const key = k + "." + kind;
    if (!stepSensitivity[key]) {
      const entry = STEPS[k].arrays["sensitivity." + kind];
      stepSensitivity[key] = decodeArray(entry, tokenPositions, bytesOf(entry)).values;
    }
    return stepSensitivity[key];
  }
  function stepChart() {
    if (STEPS.length < 2) return;
    const current = page.current;
    const width = 330, height = 150, left = 52, right = 10, top = 18, bottom = 30;
    const steps = STEPS.map(function (s) { return s.step; });
    const x0 = Math.min.apply(null, steps), x1 = Math.max.apply(null, steps);
    const x = function (v) { return left + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * (width - left - right); };
    const plot = function (title, series, selected) {
      let lo = Infinity, hi = -Infinity;
      series.forEach(function (line) { line.forEach(function (v) { lo = Math.min(lo, v); hi = Math.max(hi, v); }); });
      if (!(hi > lo)) { hi = lo + 1; lo -= 1; }
      const y = function (v) { return top + (hi - v) / (hi - lo) * (height - top - bottom); };
      let svg = '<svg class="step-chart" width="' + width + '" height="' + height +
        '"><text x="' + left + '" y="12" font-size="12">' + escapeText(title) + "</text>" +
        '<line x1="' + x(steps[current]) + '" x2="' + x(steps[current]) + '" y1="' + top + '" y2="' + (height - bottom) +
        '" stroke="#f28e2b" stroke-width="2"/>' +
        '<text x="' + (left - 4) + '" y="' + (top + 4) + '" font-size="10" text-anchor="end">' + fmt(hi) + "</text>" +
        '<text x="' + (left - 4) + '" y="' + (height - bottom) + '" font-size="10" text-anchor="end">' + fmt(lo) + "</text>" +
        '<text x="' + left + '" y="' + (height - 8) + '" font-size="10">step ' + x0 + "</text>" +
        '<text x="' + (width - right) + '" y="' + (height - 8) + '" font-size="10" text-anchor="end">' + x1 + "</text>";
      series.forEach(function (line, i) {
        const dark = i === selected;
        svg += '<polyline fill="none" stroke="' + (dark ? "#3155c4" : "#c3cad8") + '" stroke-width="' + (dark ? 2 : 1) +
          '" points="' + line.map(function (v, k) { return x(steps[k]) + "," + y(v); }).join(" ") + '"/>';
      });
      const line = series[selected];
      line.forEach(function (v, k) {
        svg += '<circle class="step-point" data-index="' + k + '" cx="' + x(steps[k]) + '" cy="' + y(v) + '" r="' +
          (k === current ? 5 : 3.5) + '" fill="' + (k === current ? "#f28e2b" : "#3155c4") + '"><title>step ' + steps[k] +
          ": " + fmt(v) + "</title></circle>";
      });
      return svg + "</svg>";
    };
    const info = data.kinds[state.kind], heads = [];
    for (let i = 0; i < info.layers * info.heads; i++) {
      heads.push(STEPS.map(function (_, k) { return sensitivityAt(k, state.kind)[i]; }));
    }
    document.getElementById("steps-chart").innerHTML =
      plot("loss L", [STEPS.map(function (s) { return s.loss.total; })], 0) +
      plot("sensitivity per head (" + state.kind + "), layer " + state.layer + " head " + state.head, heads,
        (state.layer - 1) * info.heads + state.head - 1);
  }

  // The slider and the arrow keys move every panel: ← or → (a key event, as a reader's) shows the
  // next step, and each panel's drawing (its markup, and its canvases' pixels) changes; the slider's
  // input event brings every panel back as it was.
  const PANELS = ["summary", "overview", "detail", "tokens", "saliency", "sensitivity", "rollout", "check",
    "derivation", "steps-chart"];
  function panelDrawings() {
    const drawn = {};
    PANELS.forEach(function (id) {
      const element = document.getElementById(id);
      drawn[id] = element.innerHTML + Array.prototype.map.call(element.querySelectorAll("canvas"), function (c) {
        return c.toDataURL();
      }).join("");
    });
    return drawn;
  }
  function sliderCheck(check) {
    const shown = page.current, next = shown > 0 ? shown - 1 : shown + 1, before = panelDrawings();
    document.dispatchEvent(new KeyboardEvent("keydown", { key: next < shown ? "ArrowLeft" : "ArrowRight", bubbles: true }));
    const moved = page.current === next, after = panelDrawings();
    const still = PANELS.filter(function (id) { return before[id] === after[id]; });
    const slider = document.getElementById("step-slider");
    slider.value = String(shown);
    slider.dispatchEvent(new Event("input", { bubbles: true }));
    const back = panelDrawings();
    const differ = PANELS.filter(function (id) { return before[id] !== back[id]; });
    check("the step slider and ← → move every panel", moved && still.length === 0 && page.current === shown &&
      differ.length === 0, "← / → to step " + STEPS[next].step + ": " + (moved ? "moved" : "did not move") +
      (still.length ? "; unchanged: " + still.join(", ") : "; every panel changed") + "; the slider back to step " +
      STEPS[shown].step + (differ.length ? ": not as before: " + differ.join(", ") : ": every panel as before"));
  }
  Object.assign(page, { stepSlider: stepSlider, setStep: setStep, stepPanels: stepPanels, stepChart: stepChart,
    sliderCheck: sliderCheck });
})(window.tinyformerExplain);
