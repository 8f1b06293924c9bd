// The explain page: draws the data that tinyformer.study.viz.explanation computed (the JSON in
// #explain-data) and checks it. The Python side stores what cannot be recomputed (P, Q, K, V,
// dO per head, each token's dℓₜ/dP) compactly; the page derives the rest of attention's backward
// from them in float64 and its self-test compares a sample with Python's float64 values.
//
// Its scripts (explain_page.SCRIPTS) run in a fixed order and share one object,
// window.tinyformerExplain, as their only global: each adds what it defines to it, and takes from it,
// when it starts, what the scripts before it defined; a function of a script after it (page.update)
// it calls through the object. This one, the first, creates it with the page's data.
(function () {
  "use strict";
  const started = performance.now();
  const data = JSON.parse(document.getElementById("explain-data").textContent);
  window.tinyformerExplain = {
    started: started,
    data: data,
    KINDS: Object.keys(data.kinds),
    STEPS: data.steps || [data],
    GRADS: { dP: "dL/dP", dS: "dL/dS" },
  };
})();
