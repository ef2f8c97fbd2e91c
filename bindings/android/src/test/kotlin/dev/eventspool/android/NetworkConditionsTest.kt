package dev.eventspool.android

import android.content.Intent
import android.os.BatteryManager
import android.os.PowerManager
import eventspool.waitUntil
import java.util.concurrent.CountDownLatch
import java.util.concurrent.CyclicBarrier
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicReference
import org.junit.Assert.assertEquals
import org.junit.Assert.assertFalse
import org.junit.Assert.assertTrue
import org.junit.Test
import org.junit.runner.RunWith
import org.robolectric.RobolectricTestRunner
import org.robolectric.Shadows.shadowOf
import org.robolectric.annotation.Config
import org.robolectric.annotation.Implementation
import org.robolectric.annotation.Implements
import org.robolectric.shadows.ShadowNetwork
import org.robolectric.shadows.ShadowPowerManager
import uniffi.eventspool.DeliveryState

/** Doze, Data Saver, background restrictions, and the device conditions. */
@RunWith(RobolectricTestRunner::class)
class NetworkConditionsTest : AndroidTestBase() {
    private fun blocked(on: Boolean) =
        shadowOf(connectivity).networkCallbacks.forEach { it.onBlockedStatusChanged(ShadowNetwork.newInstance(7), on) }

    @Test
    @Config(sdk = [34]) // onBlockedStatusChanged is API 29+
    fun `a blocked network is offline - no request until it is unblocked`() {
        val spool = EventSpoolAndroid.install(app, config())
        network(validated = true)
        repeat(5) { spool.track("online", mapOf("i" to it)) }
        spool.flushBlocking()
        assertTrue(spool.waitDrainedBlocking(20_000))
        val before = collector.requests()

        blocked(true) // Doze, Data Saver or a background restriction: validated, but nothing goes through
        repeat(5) { spool.track("blocked", mapOf("i" to it)) }
        spool.flushBlocking()
        assertFalse("a request went out on a blocked network", waitUntil(1_500) { collector.requests() > before })
        assertTrue("${spool.state()}", spool.state().state is DeliveryState.Offline)

        blocked(false)
        assertTrue(spool.waitDrainedBlocking(20_000))
        assertEquals(10L, collector.distinct())
    }

    @Test
    fun `conditions changed from two threads at once are both kept`() {
        EventSpoolAndroid.install(app, config())
        val installation = EventSpoolAndroid.installation()!!
        val barrier = CyclicBarrier(2)
        val lost = mutableListOf<Int>()
        for (round in 0 until 300) {
            val on = round % 2 == 0
            // The network callback's thread and the main thread's broadcast, at the same moment.
            val other = Thread {
                barrier.await()
                network(validated = true, metered = on)
            }.apply { start() }
            barrier.await()
            app.sendBroadcast(Intent(if (on) Intent.ACTION_BATTERY_LOW else Intent.ACTION_BATTERY_OKAY))
            idleMain()
            other.join()
            val c = installation.conditions
            if (c.metered != on || c.batteryLow != on) lost += round
        }
        assertEquals("rounds where one thread's update was lost", emptyList<Int>(), lost)
    }

    @Test
    @Config(shadows = [HeldPowerManager::class])
    fun `a network change while the main thread updates the conditions is kept`() {
        EventSpoolAndroid.install(app, config())
        val installation = EventSpoolAndroid.installation()!!
        network(validated = true, metered = false)
        shadowOf(app.getSystemService(PowerManager::class.java)).setIsPowerSaveMode(true)
        val entered = CountDownLatch(1)
        val proceed = CountDownLatch(1)
        HeldPowerManager.hold.set(entered to proceed)
        // The network callback's thread reports a metered network while the main thread is in
        // the middle of its power-save update (held inside isPowerSaveMode); the main thread
        // goes on once that report is through, or after 500 ms if it waits for the main thread.
        val other = Thread {
            entered.await(5, TimeUnit.SECONDS)
            val report = Thread { network(validated = true, metered = true) }.apply { start() }
            report.join(500)
            proceed.countDown()
            report.join()
        }.apply { start() }
        app.sendBroadcast(Intent(PowerManager.ACTION_POWER_SAVE_MODE_CHANGED))
        idleMain()
        other.join()
        val c = installation.conditions
        assertTrue("the metered network was lost: $c", c.metered)
        assertTrue("power saving was lost: $c", c.lowPower)
    }

    @Test
    @Config(sdk = [24])
    fun `on API 24 a low battery is read from its level`() {
        // API 24-27 have no EXTRA_BATTERY_LOW: only the level, the scale and the plug state.
        app.sendStickyBroadcast(
            Intent(Intent.ACTION_BATTERY_CHANGED)
                .putExtra(BatteryManager.EXTRA_LEVEL, 9)
                .putExtra(BatteryManager.EXTRA_SCALE, 100)
                .putExtra(BatteryManager.EXTRA_PLUGGED, 0),
        )
        EventSpoolAndroid.install(app, config())
        assertTrue("9% unplugged is a low battery", EventSpoolAndroid.installation()!!.conditions.batteryLow)
    }
}

/** The system's PowerManager, whose next `isPowerSaveMode` can be held: it says it entered, then waits. */
@Implements(PowerManager::class)
class HeldPowerManager : ShadowPowerManager() {
    @Implementation
    override fun isPowerSaveMode(): Boolean {
        hold.getAndSet(null)?.let { (entered, proceed) ->
            entered.countDown()
            proceed.await(5, TimeUnit.SECONDS)
        }
        return super.isPowerSaveMode()
    }

    companion object {
        val hold = AtomicReference<Pair<CountDownLatch, CountDownLatch>?>(null)
    }
}
