package dev.eventspool.android

import android.os.Looper
import eventspool.waitUntil
import java.time.Duration
import org.junit.Assert.assertEquals
import org.junit.Assert.assertFalse
import org.junit.Assert.assertNull
import org.junit.Assert.assertTrue
import org.junit.Test
import org.junit.runner.RunWith
import org.robolectric.RobolectricTestRunner
import org.robolectric.Shadows.shadowOf
import uniffi.eventspool.DeliveryState

/** Foreground and background as the platform reports them: a configuration change is neither. */
@RunWith(RobolectricTestRunner::class)
class LifecycleTest : AndroidTestBase() {
    @Test
    fun `ten rotations against a Retry-After of 3600 s add no request`() {
        scriptedCollector("503:3600")
        val spool = EventSpoolAndroid.install(app, config())
        var activity = foreground()
        network(validated = true)
        repeat(5) { spool.track("rotate", mapOf("i" to it)) }
        spool.flushBlocking()
        assertTrue("${spool.state()}", waitUntil { spool.state().state is DeliveryState.WaitingForUser })
        assertEquals(1L, collector.requests())

        repeat(10) {
            activity = activity.recreate()
            shadowOf(Looper.getMainLooper()).idle()
        }
        // Past any debounce: a background that was going to happen has happened.
        shadowOf(Looper.getMainLooper()).idleFor(Duration.ofSeconds(5))
        assertFalse("a rotation sent again: ${collector.requests()} requests", waitUntil(1_500) { collector.requests() > 1 })
        assertTrue("${spool.state()}", spool.state().state is DeliveryState.WaitingForUser)
        assertNull("a rotation is not a trip to the background: no job", pendingJob())
    }

    @Test
    fun `going to the background with nothing pending schedules no job`() {
        EventSpoolAndroid.install(app, config())
        val activity = foreground()
        activity.pause().stop()
        shadowOf(Looper.getMainLooper()).idleFor(Duration.ofSeconds(5))
        assertTrue(EventSpoolAndroid.installation()!!.awaitBackgroundWork(10_000))
        assertNull("nothing to deliver, no job", pendingJob())
    }
}
