// screenshot.mjs - takes the picture of the console's overview that the README shows
// (docs/console.png): logs in, opens the overview of the list's first database and saves the
// browser's window, the header's database selector in it, at 1280x900.
//
// Run by screenshot.sh, which seeds the databases and starts `outboxctl --databases FILE
// serve`; the environment says where (CONSOLE_URL, CONSOLE_TOKEN), which queue the overview
// must show (EXPECT_QUEUE) and where the picture goes (SCREENSHOT). Never downloads a browser:
// /usr/bin/chromium only.
import { chromium } from 'playwright-core';

const env = (name) => {
    const value = process.env[name];
    if (value === undefined || value === '') throw new Error(`${name} is not set`);
    return value;
};
const base = env('CONSOLE_URL');

const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await page.goto(`${base}/`);
    await page.fill('#token', env('CONSOLE_TOKEN'));
    await Promise.all([page.waitForURL(`${base}/`), page.click('button[type=submit]')]);
    await page.waitForSelector(`tr[data-queue="${env('EXPECT_QUEUE')}"]`);
    if (await page.locator('select#database option').count() < 2)
        throw new Error('the header has no database selector with the list in it');
    await page.mouse.move(0, 899); // no hover mark in the picture
    await page.screenshot({ path: env('SCREENSHOT') });
    console.log(`ok: screenshot saved to ${env('SCREENSHOT')}`);
} catch (error) {
    console.error(`FAIL: ${error.message}`);
    process.exitCode = 1;
} finally {
    await browser.close();
}
