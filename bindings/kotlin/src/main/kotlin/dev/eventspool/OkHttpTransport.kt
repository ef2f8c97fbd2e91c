package dev.eventspool

import java.io.IOException
import java.io.InterruptedIOException
import java.net.ConnectException
import java.net.SocketTimeoutException
import java.net.UnknownHostException
import java.util.concurrent.TimeUnit
import javax.net.ssl.SSLException
import okhttp3.Headers
import okhttp3.MediaType.Companion.toMediaTypeOrNull
import okhttp3.OkHttpClient
import okhttp3.Request
import okhttp3.RequestBody.Companion.toRequestBody
import uniffi.eventspool.HttpTransport
import uniffi.eventspool.HttpTransportException
import uniffi.eventspool.TransportRequest
import uniffi.eventspool.TransportResponse

/**
 * The SDK's requests on the app's OkHttp (its trust store, proxy, pinning, interceptors).
 *
 * The SDK owns the delivery policy, so OkHttp's own is switched off: no redirects (a 3xx
 * comes back to the SDK, which classifies it), no silent retry on a failed connection (the SDK
 * counts every attempt and spaces them), and each call's timeouts are the ones the SDK gives,
 * not OkHttp's defaults: `stallTimeoutMs` (`attempt_timeout_ms`, "no byte moved") as the
 * per-write and per-read timeout, so a slow uplink that keeps moving is not cut, and
 * `timeoutMs` (the attempt's ceiling) as the call timeout. Every "no answer" becomes a typed
 * [HttpTransportException]: Connect / Timeout / Tls / Io. The answer is read as the core's own
 * transport reads it: at most the request's `maxResponseBytes` plus one byte (which tells the
 * SDK the answer was cut), so a collector that answers without end cannot fill the app's memory.
 */
class OkHttpTransport(base: OkHttpClient = OkHttpClient()) : HttpTransport {
    private val client: OkHttpClient = base.newBuilder()
        .followRedirects(false)
        .followSslRedirects(false)
        .retryOnConnectionFailure(false)
        .build()

    override fun send(request: TransportRequest): TransportResponse {
        val headers = Headers.Builder()
        // OkHttp computes these from the body and the URL itself.
        request.headers.filterKeys { it.lowercase() !in OWN_HEADERS }.forEach { (k, v) -> headers.add(k, v) }
        val contentType = request.headers.entries.firstOrNull { it.key.equals("content-type", true) }?.value
        val body = if (request.method.equals("GET", true) || request.method.equals("HEAD", true)) {
            null
        } else {
            request.body.toRequestBody(contentType?.toMediaTypeOrNull())
        }
        // 0 from an SDK that gives no stall timeout: the total deadline is all there is.
        val stallMs = if (request.stallTimeoutMs > 0uL) request.stallTimeoutMs else request.timeoutMs
        val call = client.newBuilder()
            .callTimeout(request.timeoutMs.toLong(), TimeUnit.MILLISECONDS)
            .writeTimeout(stallMs.toLong(), TimeUnit.MILLISECONDS)
            .readTimeout(stallMs.toLong(), TimeUnit.MILLISECONDS)
            .build()
            .newCall(Request.Builder().url(request.url).headers(headers.build()).method(request.method, body).build())
        try {
            call.execute().use { response ->
                return TransportResponse(
                    status = response.code.toUShort(),
                    headers = response.headers.toMultimap().mapValues { it.value.joinToString(", ") },
                    body = bounded(response.body.source(), request.maxResponseBytes.toLong()),
                )
            }
        } catch (e: SocketTimeoutException) {
            throw HttpTransportException.Timeout()
        } catch (e: InterruptedIOException) {
            // callTimeout ends the call with a plain InterruptedIOException("timeout").
            throw HttpTransportException.Timeout()
        } catch (e: ConnectException) {
            throw HttpTransportException.Connect(e.toString())
        } catch (e: UnknownHostException) {
            throw HttpTransportException.Connect(e.toString())
        } catch (e: SSLException) {
            throw HttpTransportException.Tls(e.toString())
        } catch (e: IOException) {
            throw HttpTransportException.Io(e.toString())
        } catch (e: IllegalArgumentException) {
            throw HttpTransportException.Io("bad request for OkHttp: ${e.message}")
        }
    }

    private fun bounded(source: okio.BufferedSource, bound: Long): ByteArray {
        if (bound <= 0) return source.readByteArray()
        // request() reads until that many bytes are buffered or the body ends: never more than bound + 1 in memory.
        source.request(bound + 1)
        return source.buffer.readByteArray(minOf(source.buffer.size, bound + 1))
    }

    private companion object {
        val OWN_HEADERS = setOf("content-length", "host", "connection", "transfer-encoding")
    }
}
