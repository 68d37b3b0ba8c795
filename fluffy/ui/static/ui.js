// fluffy ui: live updates.  /live sends the audit head whenever it moves; the parts of
// the page that show recorded things are fetched again (same origin, no inline script).
(function () {
  "use strict";
  const badge = document.getElementById("live");
  if (!badge || !window.EventSource) return;
  const source = new EventSource(badge.dataset.live);
  let first = true;
  source.onopen = function () { badge.classList.add("on"); };
  source.onerror = function () { badge.classList.remove("on"); };
  source.onmessage = function () {
    if (first) { first = false; return; }  // the head as the page was made
    const records = document.getElementById("records");
    if (records && records.dataset.refresh) {
      fetch(records.dataset.refresh, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null) return;
          const parsed = new DOMParser().parseFromString(html, "text/html");
          const open = Array.from(records.querySelectorAll("details[open]")).map(function (d) { return d.id; });
          records.replaceChildren.apply(records, Array.from(parsed.body.childNodes).map(function (n) {
            return document.importNode(n, true);
          }));
          open.forEach(function (id) {  // a diff the person opened stays open
            const again = document.getElementById(id);
            if (again) again.open = true;
          });
        });
    }
    // a review or a held call may have appeared, or been decided elsewhere
    if (document.getElementById("state") && !document.querySelector("section.decide form:focus-within")) {
      fetch(window.location.pathname, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null) return;
          const parsed = new DOMParser().parseFromString(html, "text/html");
          ["state", "review", "held"].forEach(function (id) {
            const now = document.getElementById(id);
            const then = parsed.getElementById(id);
            if (now && then) now.replaceWith(document.importNode(then, true));
            else if (!now && then) document.getElementById("records").before(document.importNode(then, true));
            else if (now && !then) now.remove();
          });
        });
    }
  };
})();
