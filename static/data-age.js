// Turns each "data as of HH:MM:SS UTC" line of a console page (console/dash/sharing.py) into
// how old the shown data is, once a second: a stalled page says so instead of looking live.
(function () {
  function render() {
    document.querySelectorAll("[data-as-of]").forEach(function (element) {
      var asOf = Date.parse(element.getAttribute("data-as-of"));
      if (isNaN(asOf)) {
        return;
      }
      var ageS = Math.max(0, (Date.now() - asOf) / 1000);
      var stamp = element.getAttribute("data-as-of").substring(11, 19);
      element.textContent =
        "data " + (ageS < 10 ? ageS.toFixed(1) : Math.round(ageS)) + " s old (as of " + stamp + " UTC)";
      element.classList.toggle("data-stale", ageS > 10);
    });
  }
  setInterval(render, 1000);
})();
