// The explain page (see explain_namespace.js), the last of its scripts: it draws every panel of
// the view the URL hash selects and runs the self-test after the first paint.
(function (page) {
  "use strict";
  const { STEPS, useStep, readHash, header, controls, overview, markOverview, detail, detailEvents, tokens,
    saliency, sensitivity, rolloutPanel, gradientCheck, derivation, stepSlider, setStep, stepPanels,
    stepChart, selfTest } = page;
  function update() {
    stepChart();
    controls();
    markOverview();
    detail();
    tokens();
    saliency();
    sensitivity();
    derivation();
  }
  function start() {
    const wanted = readHash();
    if (wanted !== page.current) useStep(wanted);
    header();
    if (STEPS.length > 1) {
      stepSlider();
      stepPanels();
    } else {
      overview();
      rolloutPanel();
      gradientCheck();
    }
    detailEvents();
    update();
    window.addEventListener("hashchange", function () {
      const wanted = readHash();
      if (wanted !== page.current) setStep(wanted);
      else update();
    });
    const drawn = performance.now(), status = document.getElementById("self-test");
    status.setAttribute("data-drawn-ms", String(Math.round(drawn - page.started))); // every panel drawn
    if (window.PerformanceObserver) { // the browser's first paint, when it reports one
      new PerformanceObserver(function (list) {
        list.getEntries().forEach(function (entry) {
          if (entry.name === "first-contentful-paint") status.setAttribute("data-first-paint-ms", String(Math.round(entry.startTime)));
        });
      }).observe({ type: "paint", buffered: true });
    }
    // The checks take longer than the drawing: they run after the first paint (a frame's callback
    // runs before its paint; a task it queues, after), or after a second if no frame comes.
    let checked = false;
    const check = function () { if (!checked) { checked = true; selfTest(); } };
    requestAnimationFrame(function () { setTimeout(check, 0); });
    setTimeout(check, 1000);
  }
  page.update = update;
  useStep(page.current);
  const decoded = performance.now();
  start();
  document.getElementById("self-test").setAttribute("data-decoded-ms", String(Math.round(decoded - page.started)));
})(window.tinyformerExplain);
