/* web/page.h — the status page, what `GET /` answers: the node's identity,
 * job, place in the plan, state, peers, loss and throughput, in plain HTML
 * that reloads itself every 5 s (no script, nothing fetched from
 * elsewhere), and plots of the run in inline SVG.
 *
 *     WebBuf b = { .max = WEB_BUF_MAX };
 *     r = web_page_render(&snapshot, &history, &b);   // "<!DOCTYPE html>..."
 */
#pragma once

#include "web/web.h"

#define WEB_PAGE_CONTENT_TYPE "text/html; charset=utf-8"

int web_page_render(const WebSnapshot *s, const WebHistory *h, WebBuf *b);

/* The inside of <div id="plots">: an inline SVG (util/svg-plot.h) of the
 * training loss and the throughput of the samples in h, against the step. */
int web_page_plots(const WebHistory *h, WebBuf *b);
