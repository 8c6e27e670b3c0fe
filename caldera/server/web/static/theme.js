// Light or dark as the browser prefers: Bootstrap's colour mode follows data-bs-theme on <html>. Loaded before the
// stylesheets (not deferred) so the page never flashes the other theme; a file, as the CSP allows no inline script.
(function () {
  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  const apply = () => document.documentElement.setAttribute("data-bs-theme", dark.matches ? "dark" : "light");
  apply();
  dark.addEventListener("change", apply);
})();
