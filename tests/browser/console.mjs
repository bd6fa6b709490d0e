// console.mjs - drives the outbox console in Debian's headless Chromium, as an operator would:
// log in, read the seeded counts and the stream's partitions, open a dead row whose last_error is markup and see it as
// text, retry it, pause a key, replay a time range after its dry run, see the Databases view and
// switch to the list's other database; then reach it through a rebinding name and be refused.
//
// Run by test_console.sh, which seeds the database and starts `outboxctl serve`; the
// environment says where (CONSOLE_URL, CONSOLE_TOKEN), what to expect (EXPECT_READY,
// EXPECT_DEAD, EXPECT_REPLAY, DEAD_JOB_ID, XSS_ERROR, REPLAY_SINCE, STREAM_QUEUE and
// EXPECT_STREAM_LAG, its rows per partition as "0:N0,1:N1"; OTHER_DATABASE, the list's second
// database, and OTHER_QUEUE, its one queue with one ready row) and where to put files
// (SCREENSHOT, USER_DATA_DIR). Never downloads a browser: /usr/bin/chromium only.
import { chromium } from 'playwright-core';

const env = (name) => {
    const value = process.env[name];
    if (value === undefined || value === '') throw new Error(`${name} is not set`);
    return value;
};
const base = env('CONSOLE_URL');
const check = (ok, what) => {
    if (!ok) throw new Error(what);
    console.log(`ok: ${what}`);
};

const context = await chromium.launchPersistentContext(env('USER_DATA_DIR'), {
    executablePath: '/usr/bin/chromium',
    headless: true,
    // rebind.test: a name that points at the console, as a rebinding attacker's would
    args: ['--headless', '--no-sandbox', '--host-resolver-rules=MAP rebind.test 127.0.0.1', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1280, height: 900 },
});
const page = context.pages()[0] ?? await context.newPage();
let dialogs = 0;
page.on('dialog', (dialog) => { dialogs += 1; dialog.dismiss(); });
const problems = [];
page.on('console', (message) => {
    if (message.type() === 'error') problems.push(message.text());
});
page.on('request', (request) => {
    if (!request.url().startsWith(base)) problems.push(`request outside the console: ${request.url()}`);
});

const cell = async (queue, column) =>
    (await page.textContent(`tr[data-queue="${queue}"] td.${column}`)).trim();

// waits for the page a form's action reloads, and returns the message it shows
const afterAction = async (click) => {
    await Promise.all([page.waitForEvent('load'), click()]);
    return (await page.textContent('#message')).trim();
};

try {
    // 1. the login form, then the overview with the seeded counts
    const first = await page.goto(`${base}/`);
    check(first.status() === 401, 'without a login the console answers 401 with the login form');
    await page.fill('#token', env('CONSOLE_TOKEN'));
    await Promise.all([page.waitForURL(`${base}/`), page.click('button[type=submit]')]);
    problems.length = 0; // the login page itself was a 401, as checked above
    check(await cell('orders', 'ready') === env('EXPECT_READY'),
          `overview shows ${env('EXPECT_READY')} ready rows of orders`);
    check(await cell('orders', 'dead') === env('EXPECT_DEAD'),
          `overview shows ${env('EXPECT_DEAD')} dead row of orders`);
    // the stream queue: marked in the queues, its partitions in the streams section
    const stream = env('STREAM_QUEUE');
    check(await page.locator(`#queues tr[data-queue="${stream}"][data-stream] .badge.stream`).count() === 1,
          `${stream} is marked as a stream among the queues`);
    const lags = env('EXPECT_STREAM_LAG').split(',').map((pair) => pair.split(':'));
    const waiting = lags.reduce((sum, [, rows]) => sum + Number(rows), 0);
    check((await page.textContent(`#queues tr[data-queue="${stream}"] td.stream-waiting`)).trim() === String(waiting),
          `${stream} counts ${waiting} stream rows waiting`);
    check(await page.locator('#streams tbody tr').count() === lags.length,
          `the streams section lists ${lags.length} partitions`);
    for (const [partition, rows] of lags) {
        const part = page.locator(`#streams tr[data-queue="${stream}"][data-partition="${partition}"]`);
        check(await part.count() === 1 && (await part.locator('td.lag-rows').textContent()).trim() === rows,
              `partition ${partition} of ${stream} lags ${rows} rows`);
        check((await part.locator('td.owner').textContent()).trim() === 'none',
              `partition ${partition} of ${stream} has no owner`);
    }
    check(await page.locator('#stream-horizon').count() === 1, 'the snapshot horizon is reported');
    check(await page.locator('svg.chart polyline.published').count() === 1,
          'the chart of the last hour is drawn');
    await page.screenshot({ path: env('SCREENSHOT'), fullPage: true });
    console.log(`ok: screenshot saved to ${env('SCREENSHOT')}`);

    // 2. the dead row: its last_error is markup, and must show as text
    await page.goto(`${base}/dead?queue=orders`);
    const row = page.locator(`tr[data-job-id="${env('DEAD_JOB_ID')}"]`);
    await row.locator('summary').click();
    const shown = (await row.locator('pre.error-text').textContent());
    check(shown === env('XSS_ERROR'), 'last_error is shown as the text it is');
    check(await row.locator('img').count() === 0, 'no <img> element was made of it');
    check((await row.locator('pre.payload').textContent()).includes('<b>bold</b>'),
          'the payload shows as text');
    await page.waitForTimeout(300); // an onerror handler would have fired by now
    check(dialogs === 0, 'no dialog opened');

    // 3. retry it: it leaves the dead rows and is ready again
    const retried = await afterAction(() => row.locator('form[data-api^="/api/v1/dead/retry"] button').click());
    check(retried.startsWith('retried: retried 1'), `retry reported: ${retried}`);
    check(await page.locator(`tr[data-job-id="${env('DEAD_JOB_ID')}"]`).count() === 0,
          'the row left the dead rows');
    await page.goto(`${base}/`);
    check(await cell('orders', 'ready') === String(Number(env('EXPECT_READY')) + 1),
          'the retried row counts as ready');
    check(await cell('orders', 'dead') === '0', 'no dead row is left');

    // 4. pause one key and see it listed
    await page.goto(`${base}/keys`);
    const pause = page.locator('form.pause');
    await pause.locator('input[name=queue]').fill('orders');
    await pause.locator('input[name=ordering_key]').fill('customer-7');
    await pause.locator('input[name=reason]').fill('looking into it');
    const paused = await afterAction(() => pause.locator('button').click());
    check(paused.startsWith('paused: changed true'), `pause reported: ${paused}`);
    const listed = page.locator('#paused tr', { hasText: 'customer-7' });
    check(await listed.count() === 1 && (await listed.textContent()).includes('looking into it'),
          'the paused key is listed with its reason');

    // 5. replay a time range: the run button opens only after the dry run
    await page.goto(`${base}/replay`);
    await page.fill('#replay-form input[name=queue]', 'orders');
    await page.fill('#replay-form input[name=since]', env('REPLAY_SINCE'));
    check(await page.isDisabled('#replay-run'), 'replay is closed before the dry run');
    await page.click('#replay-form button[value=dry]');
    await page.waitForFunction(() => document.getElementById('message').textContent.startsWith('dry run'));
    const dry = (await page.textContent('#message')).trim();
    check(dry.startsWith(`dry run: ${env('EXPECT_REPLAY')} rows would be replayed`), `dry run reported: ${dry}`);
    check(!(await page.isDisabled('#replay-run')), 'replay opens after the dry run');
    await page.click('#replay-run');
    await page.waitForFunction(() => document.getElementById('message').textContent.startsWith('replayed'));
    const done = (await page.textContent('#message')).trim();
    check(done.startsWith(`replayed: dry_run false, replayed ${env('EXPECT_REPLAY')}`), `replay reported: ${done}`);

    // 6. the Databases view, then the selector switches the pages to the other database
    const other = env('OTHER_DATABASE');
    await page.goto(`${base}/databases`);
    check(await page.locator('#databases tbody tr').count() === 2, 'the Databases view lists both databases');
    check((await page.textContent(`#databases tr[data-database="${other}"] td.ready`)).trim() === '1',
          `${other} counts its one ready row`);
    await page.goto(`${base}/`);
    await Promise.all([page.waitForURL(`${base}/?database=${other}`), page.selectOption('#database', other)]);
    check(await cell(env('OTHER_QUEUE'), 'ready') === '1', `the overview of ${other} shows its queue`);
    check(await page.locator('tr[data-queue="orders"]').count() === 0, `the overview of ${other} shows no orders`);
    check((await page.getAttribute('nav a[href^="/keys"]', 'href')) === `/keys?database=${other}`,
          'the links carry the database chosen');

    check(dialogs === 0, 'no dialog opened during the whole session');
    check(problems.length === 0, `no console error or outside request (${problems.join('; ')})`);

    // 7. the console reached by another name that points at its address (DNS rebinding):
    //    the page gets neither the CSRF token nor an action
    const rebound = base.replace('127.0.0.1', 'rebind.test');
    const refused = await page.goto(`${rebound}/api/v1/session`);
    check(refused.status() === 403 && !(await refused.text()).includes('csrf_token'),
          'a page on a rebinding name is refused, without the CSRF token');
    const posted = await page.evaluate(async () => (await fetch('/api/v1/pause', {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ queue: 'billing' }),
    })).status);
    check(posted === 403, 'its script cannot pause a queue');
} catch (error) {
    console.error(`FAIL: ${error.message}`);
    try {
        await page.screenshot({ path: env('SCREENSHOT').replace(/\.png$/, '-failure.png'), fullPage: true });
    } catch (ignored) { /* the browser may be gone */ }
    await context.close();
    process.exit(1);
}
await context.close();
