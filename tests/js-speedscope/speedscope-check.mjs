// Opens a speedscope file in the speedscope web app (npm `speedscope`, served on 127.0.0.1) in
// headless Chromium and checks that it loads with no alert and no console error, that the profile
// name shows, and that the expected frame names appear in the rendered views.
//
// Usage: node speedscope-check.mjs FILE.speedscope.json PROFILE_NAME FRAME_NAME...
//        node speedscope-check.mjs http://URL PROFILE_NAME FRAME_NAME...
// The second form opens a page some other server already serves (e.g. `rootline view`'s URL).
// Prints one JSON line with what was seen; exits 0 only when everything checks out.
import http from 'node:http';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import puppeteer from 'puppeteer-core';

const [file, profileName, ...frameNames] = process.argv.slice(2);
if (!file || !profileName) {
  console.error('usage: node speedscope-check.mjs FILE PROFILE_NAME FRAME_NAME...');
  process.exit(2);
}
const here = path.dirname(fileURLToPath(import.meta.url));
const appDir = path.join(here, 'node_modules/speedscope/dist/release');
const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.json': 'application/json',
  '.wasm': 'application/wasm', '.png': 'image/png', '.ico': 'image/x-icon', '.woff2': 'font/woff2', '.txt': 'text/plain' };

const pageUrl = /^https?:\/\//.test(file) ? file : null;
const server = pageUrl ? null : http.createServer((req, res) => {
  const url = new URL(req.url, 'http://127.0.0.1');
  const target = url.pathname === '/profile.speedscope.json'
    ? path.resolve(file)
    : path.join(appDir, path.normalize(decodeURIComponent(url.pathname)).replace(/^([/\\])+/, '') || 'index.html');
  if (!target.startsWith(appDir) && target !== path.resolve(file)) {
    res.writeHead(403).end();
    return;
  }
  fs.readFile(target, (err, data) => {
    if (err) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'content-type': types[path.extname(target)] || 'application/octet-stream' }).end(data);
  });
});
if (server) await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const port = server ? server.address().port : null;
const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'rootline-chromium-'));
const problems = [];
const seen = { alerts: [], consoleErrors: [], pageErrors: [] };
let browser;
try {
  browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--disable-quic', '--disable-sync', '--no-first-run',
      `--user-data-dir=${userDataDir}`,
      '--enable-unsafe-swiftshader'],
  });
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 800 });
  page.on('dialog', async (dialog) => {
    seen.alerts.push(dialog.message());
    await dialog.dismiss();
  });
  page.on('console', (msg) => {
    if (msg.type() === 'error') seen.consoleErrors.push(msg.text());
  });
  page.on('pageerror', (err) => seen.pageErrors.push(String(err)));
  const profileUrl = `http://127.0.0.1:${port}/profile.speedscope.json`;
  await page.goto(pageUrl || `http://127.0.0.1:${port}/index.html#profileURL=${encodeURIComponent(profileUrl)}`,
    { waitUntil: 'load' });
  // The toolbar shows the profile's name once the file is imported.
  await page.waitForFunction((name) => document.body.innerText.includes(name), { timeout: 60000 }, profileName)
    .catch(() => problems.push(`the profile name ${JSON.stringify(profileName)} never appeared`));
  seen.canvases = await page.evaluate(() => [...document.querySelectorAll('canvas')]
    .filter((c) => c.width > 0 && c.height > 0).length);
  if (seen.canvases === 0) problems.push('no flame chart canvas was drawn');
  // The sandwich view lists every frame by name in a table.
  const clicked = await page.evaluate(() => {
    const el = [...document.querySelectorAll('div,span,button')].find((e) => e.textContent.trim().endsWith('Sandwich') && e.children.length <= 1);
    if (el) el.click();
    return Boolean(el);
  });
  if (!clicked) problems.push('no Sandwich view button');
  for (const name of frameNames) {
    await page.waitForFunction((n) => document.body.innerText.includes(n), { timeout: 20000 }, name)
      .catch(() => problems.push(`frame ${JSON.stringify(name)} is not shown`));
  }
  seen.title = await page.title();
} catch (err) {
  problems.push(String(err));
} finally {
  if (browser) await browser.close();
  if (server) server.close();
  fs.rmSync(userDataDir, { recursive: true, force: true });
}
if (seen.alerts.length) problems.push(`alerts: ${seen.alerts.join(' | ')}`);
if (seen.consoleErrors.length) problems.push(`console errors: ${seen.consoleErrors.join(' | ')}`);
if (seen.pageErrors.length) problems.push(`page errors: ${seen.pageErrors.join(' | ')}`);
console.log(JSON.stringify({ ok: problems.length === 0, problems, seen }));
process.exit(problems.length === 0 ? 0 : 1);
