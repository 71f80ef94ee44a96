"""Train heads: train a small transformer through our module on a toy task and watch its heads
form while it trains (Olsson et al. 2022: a previous-token head and an induction head appear
together, in a sudden phase change); then open the trained model on every page."""

from __future__ import annotations

import streamlit as st

from mhsa.corpus.jobs import JobState
from mhsa.training import MODEL_FAMILIES, PHASE_CHANGE_SCORE, TASKS, TOY_PREFIX, TrainConfig
from ui import page, training
from ui.state import Param, choice, flag, md_escape
from ui.training import DEFAULTS, TrainingRun, rate, setting, whole

#: the settings of the run (a link carries them: anyone can train the same model again), parsed
#: by the trainer's own checks
PARAMS = {
    "task": Param(DEFAULTS.task, choice(*TASKS)),
    "family": Param(DEFAULTS.family, setting("family", str)),
    "layers": Param(DEFAULTS.layers, setting("layers", whole)),
    "heads": Param(DEFAULTS.heads, setting("heads", whole)),
    "width": Param(DEFAULTS.width, setting("width", whole)),
    "mlp": Param(DEFAULTS.mlp, flag),
    "steps": Param(DEFAULTS.steps, setting("steps", whole)),
    "lr": Param(DEFAULTS.lr, setting("lr", rate)),
    "train_seed": Param(DEFAULTS.seed, setting("seed", whole)),
}

#: session key of this session's training run
RUN = "_mhsa_training"
EXPLANATION = f"""\
**What happens here.** A small causal transformer (a standard transformers Llama- or GPT-2-style
model) learns a toy task, every attention block running as our `MultiHeadSelfAttention`, with
gradients, for the whole run; when it stops, its weights go back into a normal transformers
folder, held by this server for a while under the name `trained:<id>`.

- **induction**: a start token, L random symbols, then the same L symbols again; scored on the
  repeated half. Predicting the repeat needs an **induction head**: at a symbol it has seen
  before, it attends to the token that came after that symbol last time, helped by a
  **previous-token head** in an earlier layer. Olsson et al. (2022) found both form together in
  a sudden **phase change**: the loss drops, the accuracy jumps, the two scores rise at once.
- **copy**, **reverse**, **sort**: input symbols, a separator, then the output.
- **reverse-seq2seq**: a BART encoder-decoder; the encoder reads the symbols, the decoder writes
  them reversed. The mosaic shows its **cross attention** (rows: the decoder's tokens, columns:
  the encoder's): a head that fetches the symbol to write draws the **anti-diagonal**, and its
  anti-diagonal score (the mean attention on it) is drawn over the steps. Its other pages show
  the encoder's self-attention.

The **previous-token score** of a head is its mean attention from each repeated symbol to the
token just before it; the **induction score**, to the token after the symbol's earlier occurrence
(the stripe below the diagonal in the mosaic), both on the probe sequence. The **phase change**
is marked at the first snapshot where a head above layer 0 reaches an induction score of
{PHASE_CHANGE_SCORE:g} (the dotted line).

Reference: C. Olsson et al., "In-context Learning and Induction Heads", Transformer Circuits
Thread, 2022.
"""

#: session key set by "Explore this model" and "Open the shipped model": the Heads page next
OPEN_HEADS = "_mhsa_open_heads"
STOPPED, DONE = ":material/stop_circle:", ":material/check_circle:"  # the run's outcomes


def _open(settings: dict) -> None:
    """Put the model (and its sentence and head) in session state before the widgets are drawn,
    then open the Heads page."""
    st.session_state.update(settings)
    st.session_state[OPEN_HEADS] = True


def _use_recipe() -> None:
    """A new task brings the settings its shipped model was trained with."""
    st.session_state.update(training.recipe_state(st.session_state["task"]))


def _train(config: TrainConfig) -> None:
    """Start a run of the settings shown when Train was clicked (before this page runs, so
    that the page draws it as running)."""
    st.session_state[RUN] = training.start(config)


def _config(device: str) -> tuple[TrainConfig | None, ValueError | None]:
    """The run's settings from the page's boxes (``None`` and why when they do not go
    together); a value the trainer refuses on its own falls back to its default, with a
    warning."""
    state = st.session_state
    try:
        return training.config_from(state, device), None
    except ValueError:
        for key, reason in training.bad_settings(state):
            st.warning(md_escape(f"{key}: {reason} Using the default."), icon=":material/warning:")
            state[key] = PARAMS[key].default
    try:
        return training.config_from(state, device), None
    except ValueError as e:  # settings that do not go together
        return None, e


def _settings(config: TrainConfig | None, refused: ValueError | None, *, busy: bool) -> None:
    """The settings box: task, family, sizes, steps, learning rate, and the buttons that train
    or open the shipped model (locked while a run is going)."""
    task = st.session_state["task"]
    with st.container(border=True):
        cols = st.columns(4)
        cols[0].selectbox(
            "Task",
            list(TASKS),
            key="task",
            disabled=busy,
            on_change=_use_recipe,
            help="  \n".join(f"**{n}**: {md_escape(t.description)}" for n, t in TASKS.items())
            + "  \nChoosing a task loads the recipe of its shipped model (the seed stays).",
        )
        cols[1].radio(
            "Family",
            list(MODEL_FAMILIES),
            key="family",
            format_func=lambda name: MODEL_FAMILIES[name].label,
            disabled=busy,
        )
        cols[2].toggle("MLP blocks", key="mlp", disabled=busy, help="Off: attention only.")
        cols[3].number_input("Seed", min_value=0, step=1, key="train_seed", disabled=busy)
        cols = st.columns(5)
        cols[0].number_input("Layers", min_value=1, step=1, key="layers", disabled=busy)
        cols[1].number_input("Heads", min_value=1, step=1, key="heads", disabled=busy)
        cols[2].number_input("Width", min_value=1, step=8, key="width", disabled=busy)
        cols[3].number_input("Steps", min_value=1, step=50, key="steps", disabled=busy)
        cols[4].number_input(
            "Learning rate", min_value=0.0, step=1e-4, format="%.5f", key="lr", disabled=busy
        )
        if refused is not None:
            page.error(refused)
        left, right = st.columns([1, 3])
        left.button(
            "Train",
            type="primary",
            disabled=busy or config is None,
            on_click=_train,
            args=(config,),
            help="Trains through the server's queue of heavy jobs; it may wait its turn.",
        )
        right.button(
            f"Open the shipped {task} model ({TOY_PREFIX}{task})",
            on_click=_open,
            args=(training.toy_state(task),),
            help="The model trained for this task that ships with the app, on the Heads page.",
        )


def _draw(figures: dict, *, final: bool = False) -> None:
    """Loss and accuracy, the probe mosaic, the head scores (in the page's zip once the run has
    finished; while it trains they change every few seconds)."""
    for i, (name, fig) in enumerate(figures.items()):
        page.figure(fig, name, key=f"train-figure-{i}", decorate=False, download=final)


@st.fragment(run_every=1.0)
def _progress(run: TrainingRun) -> None:
    """The run while it waits (its place, the expected wait) or trains (steps, rate, time left,
    the phase change once seen), every second; the whole page runs again once it has
    finished."""
    if not run.live:
        st.rerun()
    st.button("Cancel", key="train-cancel", on_click=run.cancel)
    if run.state is JobState.WAITING:
        page.queue_place(run.job)
        st.caption(training.wait_text(run))
        return
    st.progress(min(1.0, run.steps_done / run.config.steps), text=training.progress_text(run))
    phase = training.phase_change_text(run)
    if phase is not None:
        st.success(phase, icon=":material/bolt:")


@st.fragment(run_every=training.REDRAW_SECONDS)
def _live_figures(run: TrainingRun) -> None:
    """The figures while it trains, redrawn every few seconds (drawing takes CPU from the
    trainer: ``training.LiveFigures``)."""
    if run.state is JobState.RUNNING:
        _draw(run.live_figures())


def _finished(run: TrainingRun) -> None:
    """The outcome, the figures with a step slider over the snapshots, and the way out to
    every page."""
    if run.state is JobState.FAILED:
        page.error(run.job.error)
        return
    if run.model is None:
        st.info("Training cancelled before it started: nothing was trained.", icon=STOPPED)
        return
    done = run.model.info["steps_done"]
    cols = st.columns(4)
    cols[0].metric("Accuracy", f"{run.accuracy:.3f}")
    cols[1].metric("Steps", f"{done} of {run.config.steps}")
    cols[2].metric("Seconds", f"{run.seconds:.1f}")
    cols[3].metric(
        "Phase change", "none seen" if run.phase_change_step is None else run.phase_change_step
    )
    if run.stopped_early:
        st.info(f"Cancelled after step {done}: it keeps what it learned so far.", icon=STOPPED)
    st.success(training.kept_text(run.model), icon=DONE)
    st.button(
        "Explore this model",
        type="primary",
        on_click=_open,
        args=(training.explore_state(run),),
        help="Every page on this model (the sidebar's model box names it), with the probe "
        "sequence as the sentence; the Heads page opens on the head with the highest induction "
        "score (an encoder-decoder: the encoder's input as the sentence, the first head).",
    )
    index = len(run.snapshots) - 1
    if len(run.snapshots) > 1:
        index = st.select_slider(
            "The mosaic at step",
            list(range(len(run.snapshots))),
            value=index,
            format_func=lambda i: str(run.snapshots[i].step),
            key=f"train-shown-{run.model.id}",  # a new run starts at its last step
        )
    _draw(training.figures(run, step_index=index, final=True), final=True)


task_alone = training.task_alone_in_link(st.query_params, st.session_state)
with page.run("Train heads", PARAMS) as query:
    state = st.session_state
    if task_alone:  # the task's own family, as choosing the task in the box brings it
        state["family"] = training.recipe_state(state["task"])["family"]
    if state.pop(OPEN_HEADS, False):
        st.switch_page("pages/1_Heads.py")
    st.caption(
        "Train a small transformer on a toy task through our attention module and watch its "
        "heads learn: loss, accuracy, every head's attention and the phase change, live."
    )
    config, refused = _config(query.device)
    run: TrainingRun | None = state.get(RUN)
    busy = run is not None and run.live
    _settings(config, refused, busy=busy)
    with st.expander("What this page shows, and the reference"):
        st.markdown(EXPLANATION)
    if run is None:
        page.stop()
    elif busy:
        _progress(run)
        _live_figures(run)
    else:
        _finished(run)
