// tenure console: refresh the counts marked data-live="KEY" from /api/live every few
// seconds (the body's data-refresh-seconds), while the tab is visible. Numbers are written
// as text (never markup). A 401 (the session ended) stops the poll.
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-live-url");
  var seconds = parseFloat(body.getAttribute("data-refresh-seconds")) || 5;
  var timer = null;

  function show(element, value) {
    var text = value === null || value === undefined ? "" : String(value);
    if (element.textContent !== text) {
      element.textContent = text;
    }
  }

  function apply(values) {
    var marked = document.querySelectorAll("[data-live]");
    for (var i = 0; i < marked.length; i++) {
      var key = marked[i].getAttribute("data-live");
      if (Object.prototype.hasOwnProperty.call(values, key)) {
        show(marked[i], values[key]);
      }
    }
    body.setAttribute("data-live-updated", String(Date.now()));
  }

  function poll() {
    if (document.hidden) {
      return;
    }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) {
        if (response.status === 401) {
          window.clearInterval(timer);
          return null;
        }
        return response.ok ? response.json() : null;
      })
      .then(function (document_) {
        if (document_ && document_.values) {
          apply(document_.values);
        }
      })
      .catch(function () { /* the next round tries again */ });
  }

  if (url && document.querySelector("[data-live]")) {
    timer = window.setInterval(poll, seconds * 1000);
  }
}());
