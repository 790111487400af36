/* run/events.h — the MESSAGE_IDs of the journal entries operators filter
 * on (`journalctl MESSAGE_ID=...`), explained in units/ravnest.catalog. */
#pragma once

#define EVENT_PEER_JOINED "4cdad09663cd42368ebe52c8a27a4f9d"
#define EVENT_PEER_LEFT "7991b5d1b7a544c4a2aa6ec1c12a7d7d"
#define EVENT_AUTH_FAILED "caa7e18a0a8d40e0af00cf4d111607e6"
#define EVENT_AVERAGING_ROUND "d306c49439dc43a5af5ca1ec5d141dda"
#define EVENT_CHECKPOINT "dab0480494d14e2f85ea77a43409cbde"
#define EVENT_PAUSED "558d8868fd8d40158bc66e62d0dc3bb8"
#define EVENT_RESUMED "49ec8719fe634489b24ae51fae7ced69"
#define EVENT_RELOAD "b80ee951f6f846a8bc577d85567f853b"
