"""What GuiEnv runs inside the task's page, and why: the settle loop's bounds, the fast path's page-side scripts
(edge_client.env), the caret that does not blink, the pointer's rest and the blur at every reset. Each makes a screen a
function of the episode's actions alone.
"""

from __future__ import annotations

from string import Template

SETTLE_MAX_S = 2.0
SETTLE_POLL_S = 0.02
# True while a jQuery (or jQuery UI) animation runs on the page; pages without jQuery never animate this way.
ANIMATING_JS = "return !!(window.jQuery && jQuery.fn && jQuery(':animated').length);"

# A text caret blinks (500 ms on, 500 ms off), so whether a screenshot shows it depended on wall time: on how
# long the policy thought and how loaded the machine was, not on what was done (a model that clicked a filled
# field again saw it, or not, and acted differently). Every page we load gets a caret that does not blink
# (CSS `caret-animation: manual`): the screen is a function of the episode's actions, on both paths.
STEADY_CARET_JS = """
const style = document.createElement("style");
style.textContent = "* { caret-animation: manual !important; }";
document.head.appendChild(style);
"""

# Where the pointer rests when an episode starts, on both paths: outside the 160x210 task area (inside both
# paths' viewports). Left where the last episode's last click was, it hovered over whatever the new episode
# drew there, so a first screen depended on the episode before it (click-tab seed 7001: success or failure
# by which seed ran first in that browser).
POINTER_REST = (480, 250)

# Focus left where the last episode left it: a task that keeps its elements across episodes (enter-password's
# fields) then drew a new episode's first screen with the last field still focused, ringed, so a first screen
# depended on the episode before it (found by the search's replay check: edge_client.search). Every reset blurs
# it first, on both paths; a task that focuses an element itself still does.
BLUR_JS = "if (document.activeElement) document.activeElement.blur();"

# The fast path's page-side scripts. Each runs as one task of the page's event loop and awaits in-page (a
# timer, not a round trip): reset is miniwob's force_stop + begin_task + get_observation in one call, a step's
# read is its settle loop + get_metadata + get_observation (without the screenshot, which CDP captures).
PAGE_HELPERS = """
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
const metadata = () => ({done: WOB_DONE_GLOBAL, env_reward: WOB_REWARD_GLOBAL,
                         raw_reward: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON});
const observe = meta => meta.done ? {meta}
  : {meta, utterance: core.getUtterance(), dom: $read_dom ? core.getDOMInfo() : null};
"""
RESET_JS = Template("""(async () => {$helpers
  core.EPISODE_MAX_TIME = Math.max(core.EPISODE_MAX_TIME, $max_ms);
  core.endEpisode(0);
  $blur
  $seed
  core.setDataMode("train");
  core.startEpisodeReal();
  for (let i = 0; i < 20 && !WOB_TASK_READY; i++) await sleep(50);
  if ($warm_up) {  // two frames: the episode's images and fonts are fetched (and cached for the real start)
    for (let i = 0; i < 2; i++) await new Promise(resolve => requestAnimationFrame(resolve));
    return true;
  }
  return WOB_TASK_READY ? observe(metadata()) : null;
})()""")
READ_JS = Template("""(async () => {$helpers
  await sleep(0);  // what the action's handlers deferred by a zero timer runs first, as between round trips
  const deadline = performance.now() + $settle_ms;
  while (window.jQuery && jQuery.fn && jQuery(':animated').length && performance.now() < deadline)
    await sleep($poll_ms);
  return observe(metadata());
})()""")
DONE_JS = "WOB_DONE_GLOBAL"
DOM_JS = "(WOB_DONE_GLOBAL ? null : core.getDOMInfo())"
