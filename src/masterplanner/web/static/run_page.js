// The run page's live body (`#run-body`) is fetched again on the run's change events. What the
// person is doing in it is not thrown away by such a refresh:
// - what they type to answer a request (or in the feedback comment) is kept across refreshes
//   (`hx-preserve` on those fields);
// - while they edit the plan review or the retry form, or after an answer of theirs was refused
//   (409, 422: the page shows their edit and what is wrong), the body is not fetched again; a
//   note says the run has changed and offers the latest, which they take when they choose.
(function () {
  "use strict";
  window.mpEditing = false;
  var EDITED = "#review-form, #retry-form";

  function changedNote(shown) {
    var note = document.getElementById("run-changed");
    if (note) note.hidden = !shown;
  }

  document.addEventListener("input", function (event) {
    if (event.target.closest && event.target.closest(EDITED)) window.mpEditing = true;
  });

  document.addEventListener("htmx:beforeRequest", function (event) {
    var detail = event.detail;
    if (detail.elt.id === "run-body" && detail.requestConfig.verb === "get" && window.mpEditing) {
      event.preventDefault(); // checked when the request would go, not only when the event came
      changedNote(true);
    }
  });

  document.addEventListener("htmx:afterRequest", function (event) {
    var detail = event.detail;
    if (detail.requestConfig.verb !== "post" || !detail.xhr) return;
    var refused = detail.xhr.status === 409 || detail.xhr.status === 422;
    var form = detail.elt.closest ? detail.elt.closest("form") : null;
    // a refused answer comes back with what was sent and why: keep it on the page
    window.mpEditing = refused && form !== null;
    if (!window.mpEditing) changedNote(false);
  });

  document.addEventListener("click", function (event) {
    if (!event.target.closest || !event.target.closest("#run-changed-show")) return;
    var body = document.getElementById("run-body");
    if (!body) return;
    window.mpEditing = false;
    changedNote(false);
    htmx.ajax("GET", body.getAttribute("hx-get"), { target: "#run-body", swap: "outerHTML" });
  });
})();
