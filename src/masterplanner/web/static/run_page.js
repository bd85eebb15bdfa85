// The run page's live body (`#run-body`) is fetched again on the run's change events, and the
// page goes on following the run whatever the person does in it. What they are doing is not
// thrown away by such a refresh:
// - what they type to answer a request (or in the feedback comment) is kept across refreshes
//   (`hx-preserve` on those fields);
// - a part of the body with a form (`data-part`: the plan review, a request, the retry form, the
//   rating) that they typed in, or whose answer was refused (409, 422: the body shows their
//   input and what is wrong), is held: a refresh shows everything else as the run now is and
//   keeps that part as they left it (its place in the fetched body is marked `hx-preserve`, so
//   HTMX keeps the part on the page there);
// - when the run has moved past a held part (its request answered elsewhere, or replaced by
//   another, or the run cancelled), the part stays where it was, with their input, and a note
//   says the run has changed and offers the latest, which they take when they choose.
// A part is let go when its form is sent and taken, or with the latest. (Before, a held part held
// the whole body: after one refused edit, a 422 about their input alone, the page no longer
// showed the run's progress until they asked for it.)
// A form they send reaches the server, or they are told it did not: no refresh is shown while
// they press in the body (a refresh between press and release made the browser send no click),
// a form sent before HTMX has set a fetched body up is sent as HTMX would (the browser loaded the
// run's page with it instead), and an answer the server did not take is said, its part held, with
// what to do (send it again, or not: refused, or gone); one taken that the server could not show
// the run after is said taken.
// When the person's login ends while the page is open (a server started with --auth: its cookie
// expired or was cleared, or the server was given a new token), the page says so above the body,
// with a login form there: the body stays as it was, what they typed included, and a form the
// server refused for want of a login is sent once they log in again.
(function () {
  "use strict";
  var held = {}; // the ids of the held parts, and of a refusal shown beside a part the run moved past
  var stale = false; // a held part the run has moved past
  var refusedPart = null; // the part whose refusal `#run-problem` explains
  var typing = null; // what the person types in, in a held part, and where the caret is, over a swap
  // HTML drops a line break right after a `<textarea>` start tag (the pages write one there), and
  // a browser writing a parsed body out again (Chromium) writes none: without one put back, a
  // text beginning with a line break lost it in each refresh written out around a held part
  var breakWrittenOut = (function () {
    var area = document.createElement("textarea");
    area.textContent = "\nx";
    return area.outerHTML.indexOf(">\n\nx<") !== -1;
  })();

  function changedNote() {
    var note = document.getElementById("run-changed");
    if (note) note.hidden = !stale;
  }

  function partOf(element) {
    var part = element && element.closest ? element.closest("[data-part]") : null;
    return part && part.id ? part : null;
  }

  // In the fetched body `body`, the place of the element `id` now on the page is marked to be kept.
  function keep(body, id) {
    var shown = document.getElementById(id);
    if (!shown) {
      delete held[id];
      return;
    }
    var fresh = body.querySelector("#" + CSS.escape(id));
    if (shown.hasAttribute("data-part")) {
      var moved = !fresh || fresh.getAttribute("data-part") !== shown.getAttribute("data-part");
      stale = stale || moved;
    }
    var place = document.createElement(shown.tagName.toLowerCase()); // empty: nothing in it to keep
    place.id = id;
    place.setAttribute("hx-preserve", "true");
    if (fresh) {
      fresh.replaceWith(place);
      return;
    }
    // gone from the run's body: where it was, before the next element still there
    for (var next = shown.nextElementSibling; next; next = next.nextElementSibling) {
      var after = next.id ? body.querySelector(":scope > #" + CSS.escape(next.id)) : null;
      if (after) {
        body.insertBefore(place, after);
        return;
      }
    }
    body.appendChild(place);
  }

  // An answer sent from the page (a POST into the body) while a refresh is on its way: the refresh
  // replaced the body the answer was to be shown in, and the answer's response (a refusal and
  // why) went into a body no longer on the page. While an answer is out, refreshes are not shown:
  // its response is the run as it is then, and a refresh left out is fetched again after it.
  // Nor while the person presses in the body (its primary button, or Space held on a button): a
  // click is the press and the release on one element, and a refresh between them replaced or
  // moved it (a held part too: HTMX takes it out of the page and puts it back), so the browser
  // sent no click at all: an Answer clicked while a burst of the run's changes came went nowhere.
  var sending = [];
  var pressing = false;
  var missed = false;
  function fetchMissed() {
    var body = document.getElementById("run-body");
    if (sending.length || pressing || !missed || !body) return;
    missed = false; // fetched at once: the body's trigger drops a change within 400 ms of another
    htmx.ajax("GET", body.getAttribute("hx-get"), { source: body, target: body, swap: "outerHTML" });
  }
  // Requests whose response goes into the body, by their `htmx:beforeRequest` detail (HTMX reads
  // its `target` when the response comes). A response for a body no longer on the page did worse
  // than nothing: HTMX takes the page's kept elements (`hx-preserve`: a held part, what the person
  // types) out of the page to put them into the swapped body, and with no body to swap into they
  // were gone, what the person typed with them. Seen: an Answer sent with no text, after the
  // response to an Approve had replaced the body a refresh was out for. When the body is replaced,
  // the requests still out for it are pointed at the new one: an answer's response is shown
  // there; a refresh's only when it was asked knowing of more changes than the body now shown
  // (else it may show the run as it was before the answer now shown; a change after is fetched
  // when the new body is set up, `htmx:load` below).
  var intoBody = [];
  var outdated = new WeakSet(); // refreshes out for a body since replaced
  document.addEventListener("htmx:beforeRequest", function (event) {
    var detail = event.detail;
    var xhr = detail.xhr;
    var post = detail.requestConfig && detail.requestConfig.verb === "post";
    var body = detail.target && detail.target.id === "run-body";
    if (!xhr || !(post || body)) return;
    if (post) sending.push(xhr);
    if (body) intoBody.push(detail);
    // (not `htmx:afterRequest`: HTMX sends it to the element the request came from, which a swap
    // may have taken out of the page, and from there it reaches no listener here)
    var failed = false; // the server was not reached
    xhr.addEventListener("error", function () {
      failed = true;
    });
    xhr.addEventListener("loadend", function () {
      if (post && !document.contains(detail.requestConfig.elt)) unheard(detail, failed);
      sending = sending.filter(function (out) {
        return out !== xhr;
      });
      intoBody = intoBody.filter(function (out) {
        return out !== detail;
      });
      fetchMissed();
    });
  });
  // HTMX says how an answer went when it was not swapped in (not taken: `htmx:responseError`,
  // `htmx:sendError`, a 401; taken with no body to show: a 204's `HX-Trigger`) to the form that
  // sent it. When another response's swap took that form out of the page meanwhile (a form not
  // held: an Approve, a rating with no comment), that reached no listener and went unsaid: an
  // answer the server failed on looked sent. Said here, from the request's end, instead.
  function unheard(detail, failed) {
    var status = detail.xhr.status;
    if (failed) unsent(detail, UNREACHED);
    else if (status >= 400 && status !== 409 && status !== 422) notTaken(detail);
    else if (status === 204) {
      var trigger = detail.xhr.getResponseHeader("HX-Trigger");
      var said = null;
      try {
        said = trigger ? JSON.parse(trigger)[TAKEN] : null;
      } catch (error) {
        // not JSON: not ours
      }
      if (typeof said === "string") taken(detail.requestConfig.elt, said);
    }
  }
  document.addEventListener("htmx:afterSwap", function (event) {
    var replaced = event.detail.target;
    var body = document.getElementById("run-body");
    if (!replaced || replaced.id !== "run-body" || !body || replaced === body) return;
    intoBody.forEach(function (detail) {
      if (detail.target !== replaced || detail === event.detail) return; // (the swap's own request)
      detail.target = body;
      if (detail.requestConfig.verb === "get") outdated.add(detail.xhr);
    });
  });
  // Only what makes a click holds refreshes: the primary button (a right-click opens a menu, which
  // takes the release) or Space on a button. A press ends with its release, or with what else the
  // page sees when something took the release: the menu (`contextmenu`), a choice made in a
  // select's list (`change`), a drag's end, the window left. A press longer than `PRESS_MS` holds
  // them no longer (before, a press whose release the page never saw held every refresh back until
  // the next click: the page stopped following the run).
  var PRESS_MS = 3000;
  var pressEnds = null; // the timer that ends a press held too long
  function press(event) {
    var inBody = event.target.closest && event.target.closest("#run-body");
    var key =
      event.type === "keydown"
        ? event.key === " " && !event.repeat && event.target.closest("button")
        : event.isPrimary !== false && event.button === 0;
    if (!inBody || !key) return;
    pressing = true;
    clearTimeout(pressEnds);
    pressEnds = setTimeout(function () {
      pressing = false;
      fetchMissed();
    }, PRESS_MS);
  }
  function release() {
    if (!pressing) return;
    clearTimeout(pressEnds);
    setTimeout(function () {
      pressing = false; // after the click the release makes, and the answer it sends
      fetchMissed();
    }, 0);
  }
  document.addEventListener("pointerdown", press, true);
  document.addEventListener("keydown", press, true);
  ["pointerup", "pointercancel", "keyup", "contextmenu", "dragend"].forEach(function (type) {
    document.addEventListener(type, release, true);
  });
  document.addEventListener(
    "change",
    function (event) {
      // a select's only: a text field's comes as the press on a button takes the focus from it
      if (event.target.tagName === "SELECT") release();
    },
    true
  );
  window.addEventListener("blur", release);

  // A form in a fetched body that HTMX has not set up yet (it does 20 ms after the swap) is sent
  // by the browser itself: a load of the run's page with the fields in its address, the answer
  // given to nobody. Sent here as HTMX would, with the button clicked.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var post = form.getAttribute && form.getAttribute("hx-post");
    if (event.defaultPrevented || !post || !form.closest("#run-body")) return;
    event.preventDefault();
    var button = event.submitter;
    var values = {};
    if (button && button.name) values[button.name] = button.value;
    htmx.ajax("POST", post, { source: form, target: "#run-body", swap: "outerHTML", values: values });
  });

  // An answer the server did not take: said above the body, and its part held, so what the person
  // typed and chose stays. What to do depends on why: sent again once the server is reached or
  // works again (out of reach, a 5xx); not when it refused it as from another site (403: the page
  // is to be loaded again from the server's address) or no longer has what it answers (404). (Before,
  // each said "send it again", into the same refusal.)
  function unsent(detail, text) {
    var request = detail.requestConfig;
    var note = document.getElementById("run-unsent");
    if (!request || request.verb !== "post" || !note) return;
    var part = partOf(request.elt);
    if (!document.contains(request.elt)) text = text.split(KEPT)[0] + GONE; // nothing below to keep
    else if (part) held[part.id] = true;
    note.textContent = text;
    note.hidden = false;
    var taken = document.getElementById("run-taken");
    if (taken) taken.hidden = true;
  }
  function serverWords(xhr) {
    // a refusal's reason, in the server's words (its JSON `error`)
    try {
      var said = JSON.parse(xhr.responseText).error;
      return typeof said === "string" ? said : "";
    } catch (error) {
      return "";
    }
  }
  var KEPT = "What you typed and chose is still below";
  var GONE = "Its form is no longer on the page (the run has moved on): answer again from the run as it is now.";
  var UNREACHED = "Not sent: the server could not be reached. " + KEPT + ": send it again.";
  document.addEventListener("htmx:sendError", function (event) {
    unsent(event.detail, UNREACHED);
  });
  function notTaken(detail) {
    var status = detail.xhr.status;
    var said = serverWords(detail.xhr);
    var why = "HTTP " + status + (said ? ": " + said : "");
    if (status === 401) loginEnded(detail);
    else if (status === 403)
      unsent(
        detail,
        "Not sent: the server refused it (" + why + "): sending it again from this page cannot help. " +
          "Load the page again from the server's own address. " + KEPT + ", to copy."
      );
    else if (status === 404)
      unsent(
        detail,
        "Not sent: what it answers is no longer on the server (" + why + "): sending it again cannot " +
          "help. Load the page again to see the run as the server has it. " + KEPT + ", to copy."
      );
    else if (status >= 500)
      unsent(detail, "Not sent: the server failed on it (" + why + "). " + KEPT + ": send it again.");
    else unsent(detail, "Not sent: the server refused it (" + why + "). " + KEPT + ".");
  }
  document.addEventListener("htmx:responseError", function (event) {
    notTaken(event.detail);
  });
  // Taken, but the server could not read the run after it (`pages.TAKEN_EVENT`): said, the body
  // left as it is and fetched again once the answer's request is done. Also sent after the body's
  // swap with a note on how an answer was taken: one sent again that was taken the first time
  // (this page lost the reply), or one whose follow-up failed.
  function taken(source, text) {
    var note = document.getElementById("run-taken");
    var part = partOf(source);
    if (part) delete held[part.id];
    var unsentNote = document.getElementById("run-unsent");
    if (unsentNote) unsentNote.hidden = true;
    if (note) {
      note.textContent = text;
      note.hidden = false;
    }
    missed = true;
  }
  var TAKEN = "runActionTaken";
  document.addEventListener(TAKEN, function (event) {
    taken(event.target, event.detail.value);
  });

  // The login ended: the server answers the page's requests with a 401 (a refresh is not shown, a
  // form not taken). Before, a refresh followed the server's redirect and showed the login page
  // inside the run's body, what was typed gone; an answer sent was "not sent: the server answered
  // with an error (HTTP 401)", to be sent again into the same refusal.
  var refused = null; // the form refused for want of a login, and the button it was sent with
  function loginEnded(detail) {
    var request = detail.requestConfig;
    var note = document.getElementById("run-login");
    if (!note) return;
    var form = request && request.verb === "post" && request.elt.closest ? request.elt.closest("form") : null;
    if (form && !document.contains(form)) form = null; // gone from the page: nothing to send again
    if (form) {
      var part = partOf(form);
      if (part) held[part.id] = true;
      var values = {}; // the button pressed (the form's own values are taken from it when it is sent)
      form.querySelectorAll("button[name]").forEach(function (button) {
        var sent = request.formData ? request.formData.get(button.name) : null;
        if (sent !== null) values[button.name] = sent;
      });
      refused = { form: form, values: values };
    }
    document.getElementById("run-login-why").textContent = refused
      ? "Not sent: your login to this server has ended. What you typed and chose is still below: " +
        "log in again here and it is sent."
      : "Your login to this server has ended: this page no longer follows the run. Log in again here.";
    var unsentNote = document.getElementById("run-unsent");
    if (unsentNote) unsentNote.hidden = true; // this note says why
    note.hidden = false;
  }
  // Logged in again (here, or in another tab: a request of the page's was taken, `answered`): the
  // refused form is sent, else the body is fetched (unless that request did), with what the run did
  // meanwhile.
  function loginBack(answered) {
    var note = document.getElementById("run-login");
    if (!note || note.hidden) return;
    note.hidden = true;
    document.getElementById("run-login-problem").hidden = true;
    var form = refused && document.contains(refused.form) ? refused : null;
    refused = null;
    if (form) {
      var post = form.form.getAttribute("hx-post");
      htmx.ajax("POST", post, { source: form.form, target: "#run-body", swap: "outerHTML", values: form.values });
      return;
    }
    if (answered) return;
    missed = true;
    fetchMissed();
  }
  document.addEventListener("htmx:afterRequest", function (event) {
    var status = event.detail.xhr ? event.detail.xhr.status : 0;
    if (status && status !== 401) loginBack(true);
  });
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.id !== "run-login-form") return;
    event.preventDefault();
    var problem = document.getElementById("run-login-problem");
    function say(text) {
      problem.textContent = "Not logged in: " + text + ".";
      problem.hidden = false;
    }
    var sent = new URLSearchParams(new FormData(form));
    sent.set("next", location.pathname);
    // a token taken is answered with a redirect, not followed here: the login cookie it sets is kept
    fetch("/login", { method: "POST", body: sent, redirect: "manual", credentials: "same-origin" }).then(
      function (response) {
        if (response.type === "opaqueredirect") {
          form.reset();
          loginBack(false);
          return;
        }
        return response.text().then(function (text) {
          var page = document.createElement("template");
          page.innerHTML = text;
          var why = page.content.querySelector(".error");
          say(why ? why.textContent : "the server answered with an error (HTTP " + response.status + ")");
        });
      },
      function () {
        say("the server could not be reached");
      }
    );
  });
  // The run's event stream lost (the server restarted, maybe with a new token): the body is
  // fetched, which shows what the run did meanwhile, or finds the login ended and says so.
  document.addEventListener("htmx:sseError", function (event) {
    var source = event.detail.source;
    if (!source || source.readyState !== EventSource.CLOSED) return;
    missed = true;
    fetchMissed();
  });

  // The body's trigger takes the first change of a burst and drops the others until the fetched
  // body replaces it (`throttle`, and a request asked for while one is out goes with the body it
  // was asked from), and a change that comes after the fetched body went in but before HTMX has
  // set it up (its settle, 20 ms on) reaches no body at all. A change that came after the body
  // now on the page was asked for may be newer than what the server rendered: once that body is
  // set up (`htmx:load`), it is fetched once more. (Before, when those were the run's last events,
  // the page showed the run running for good: its event stream had ended. A body fetched again
  // right after the swap went unfetched: the new body did not listen for its trigger yet.)
  var changes = 0; // change events the run's stream has brought
  var asked = new WeakMap(); // a request that was sent: `changes` then
  var shown = 0; // `changes` when the body on the page was asked for
  var createEventSource = htmx.createEventSource;
  if (createEventSource) {
    // counted on the stream itself, before the body hears of them: a change that starts a fetch
    // is counted in what that fetch shows, and one that reaches no body is counted too
    htmx.createEventSource = function (url) {
      var source = createEventSource(url);
      source.addEventListener("change", function () {
        changes++;
      });
      return source;
    };
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    if (event.detail.xhr) asked.set(event.detail.xhr, changes);
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    var detail = event.detail;
    if (!detail.target || detail.target.id !== "run-body" || !asked.has(detail.xhr)) return;
    shown = asked.get(detail.xhr);
  });
  document.addEventListener("htmx:load", function (event) {
    var body = event.target;
    if (body && body.id === "run-body" && changes > shown) htmx.trigger(body, "sse:change");
  });

  document.addEventListener("input", function (event) {
    var part = partOf(event.target);
    if (part) held[part.id] = true;
  });

  document.addEventListener("htmx:beforeSwap", function (event) {
    var detail = event.detail;
    if (!detail.shouldSwap || !detail.target || detail.target.id !== "run-body") return;
    if (typeof detail.serverResponse !== "string") return;
    var status = detail.xhr ? detail.xhr.status : 200;
    var refused = status === 409 || status === 422;
    var request = detail.requestConfig; // (`detail.elt` is the body swapped, not what sent the request)
    if (request && request.verb === "get" && outdated.has(detail.xhr) && asked.get(detail.xhr) <= shown) {
      detail.shouldSwap = false; // asked for a body since replaced by one that knew as much
      return;
    }
    if (request && request.verb === "get" && (sending.length || pressing)) {
      detail.shouldSwap = false; // an answer is out (its response shows the run), or being clicked
      missed = true;
      return;
    }
    if (request && request.verb === "post") {
      ["run-unsent", "run-taken"].forEach(function (id) {
        var note = document.getElementById(id);
        if (note) note.hidden = true; // this one reached the server, and its response says how it went
      });
    }
    var sent = request && request.verb === "post" ? partOf(request.elt) : null;
    if (sent) {
      delete held[sent.id]; // the answer to its own form says how it went, and why if refused
      if (refusedPart === sent.id || refused) {
        // it explained this part's refusal, or a newer refusal's reason takes its place; another
        // part's answer taken keeps it
        delete held["run-problem"];
        refusedPart = null;
      }
    }
    if (!Object.keys(held).length && !(sent && refused)) {
      stale = false;
      changedNote();
      return;
    }
    var page = document.createElement("template");
    page.innerHTML = detail.serverResponse;
    var body = page.content.querySelector("#run-body");
    if (!body) return;
    stale = false;
    var parts = Object.keys(held).filter(function (id) {
      var shown = document.getElementById(id);
      return shown !== null && shown.hasAttribute("data-part");
    });
    if (!parts.length && !(sent && refused)) held = {}; // a refusal shown beside no part: let go
    Object.keys(held).forEach(function (id) {
      keep(body, id);
    });
    if (sent && refused) {
      var fresh = body.querySelector("#" + CSS.escape(sent.id));
      if (!fresh || fresh.getAttribute("data-part") !== sent.getAttribute("data-part")) {
        keep(body, sent.id); // the run moved past it: the answer stays as they sent it
      }
      held[sent.id] = true; // else the body shows their input and what is wrong: kept from now on
      // and why it was refused stays beside it (outside the part, it went with the next refresh)
      var why = body.querySelector("#run-problem");
      if (why) {
        held[why.id] = true;
        refusedPart = sent.id;
      }
    }
    if (!breakWrittenOut) {
      page.content.querySelectorAll("textarea").forEach(function (area) {
        area.textContent = "\n" + area.textContent;
      });
    }
    detail.serverResponse = page.innerHTML;
    changedNote();
    // A browser without `moveBefore` puts a kept part back by taking it out of the page and in
    // again, which takes the focus from what the person types in: given back after the swap.
    var active = document.activeElement;
    var where = partOf(active);
    typing = where && held[where.id] ? { element: active, start: null, end: null } : null;
    if (typing) {
      try {
        typing.start = active.selectionStart;
        typing.end = active.selectionEnd;
      } catch (error) {
        // an input without a caret (a checkbox, a number): the focus alone is given back
      }
    }
  });

  document.addEventListener("htmx:afterSwap", function () {
    var was = typing;
    typing = null;
    if (!was || !document.contains(was.element) || document.activeElement === was.element) return;
    was.element.focus({ preventScroll: true });
    if (typeof was.start === "number" && was.element.setSelectionRange) {
      was.element.setSelectionRange(was.start, was.end);
    }
  });

  document.addEventListener("click", function (event) {
    if (!event.target.closest || !event.target.closest("#run-changed-show")) return;
    var body = document.getElementById("run-body");
    if (!body) return;
    held = {};
    refusedPart = null;
    stale = false;
    changedNote();
    htmx.ajax("GET", body.getAttribute("hx-get"), { target: "#run-body", swap: "outerHTML" });
  });
})();
