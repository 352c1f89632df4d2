// The console's shell: who is signed in (the API key prompt), the navigation, the page router.
import { ApiError, auth, h, request } from "./api.js";
import { playground } from "./playground.js";
import { deadLetters, job, jobs, overview } from "./views.js";

const main = document.getElementById("main");
const who = document.getElementById("who");
let current = null; // the shown page's AbortController
let whoami = null;

function signIn(message) {
  const key = h("input", { type: "password", autocomplete: "off", placeholder: "API key", "data-testid": "api-key" });
  const form = h("form", { class: "signin" },
    h("h1", {}, "Sign in"),
    h("p", {}, "The console sends your API key as the Authorization header. It is kept in this tab's " +
      "session storage only, and never put in a URL."),
    message ? h("p", { class: "error", "data-testid": "signin-error" }, message) : null,
    h("div", { class: "toolbar" }, key, h("button", { type: "submit", class: "primary", "data-testid": "sign-in" }, "Sign in")));
  form.addEventListener("submit", (e) => { e.preventDefault(); auth.set(key.value); start(); });
  who.replaceChildren();
  main.replaceChildren(form);
  key.focus();
}

function showWho() {
  document.getElementById("nav-dead-letters").hidden = !whoami.admin;
  const out = h("button", { type: "button", class: "link", "data-testid": "sign-out" }, "sign out");
  out.addEventListener("click", () => { auth.clear(); whoami = null; start(); });
  who.replaceChildren(h("span", { "data-testid": "tenant" }, whoami.open ? "open api (no keys)" : `tenant ${whoami.tenant}`),
    whoami.admin ? h("span", { class: "badge admin" }, "operator") : null, whoami.open ? null : out);
}

function route() {
  if (current) current.abort();
  current = new AbortController();
  const [page, id] = (location.hash.replace(/^#\/?/, "") || "overview").split("/");
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === page);
  const ctx = { signal: current.signal, whoami, id };
  const pages = { overview, jobs: id ? job : jobs, "dead-letters": deadLetters, playground };
  const show = pages[page] || overview;
  show(main, ctx).catch((error) => {
    if (error instanceof ApiError && error.status === 401) signIn(error.message);
    else main.replaceChildren(h("p", { class: "error" }, error.message));
  });
}

async function start() {
  try {
    whoami = await request("GET", "/v1/console/overview");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) { signIn(auth.key ? error.message : null); return; }
    main.replaceChildren(h("p", { class: "error" }, error.message));
    return;
  }
  showWho();
  route();
}

window.addEventListener("hashchange", () => { if (whoami) route(); });
start();
