// Runs first: records every error, unhandled rejection and Content-Security-Policy violation,
// so that the self-test (and a test reading the DOM) sees them.
(function () {
  "use strict";
  var errors = [];
  window.explainErrors = errors;
  function record(kind, message) {
    errors.push(kind + ": " + message);
    var status = document.getElementById("self-test");
    if (status) {
      status.setAttribute("data-errors", JSON.stringify(errors));
      status.setAttribute("data-status", "fail");
      status.textContent = "failed: " + errors[errors.length - 1];
    }
  }
  window.addEventListener("error", function (event) {
    record("error", (event.message || "unknown") + " (line " + event.lineno + ", column " + event.colno + ")");
  });
  window.addEventListener("unhandledrejection", function (event) {
    record("unhandledrejection", String(event.reason));
  });
  document.addEventListener("securitypolicyviolation", function (event) {
    record("content security policy", event.violatedDirective + " blocked " + (event.blockedURI || "inline"));
  });
})();
