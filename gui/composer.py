"""Where a message is written and sent, and how: the composer under the conversation
(what the reply waits for, the model and context indicator, the message box, Send / Stop /
Continue / Regenerate / Edit last / Export) and the chat's settings column (system prompt,
context policy, sampling). Widgets only: the chat pane connects them to what they do."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from gui.flow_layout import FlowLayout
from gui.sampling_panel import SamplingPanel
from gui.theme import icon
from inference.context import POLICIES, POLICY_TIPS


def _hint(text: str = "") -> QLabel:
    label = QLabel(text)
    label.setObjectName("Hint")
    return label


class Composer(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        # What a reply waits for before its first token (kernels compiling), as it happens.
        self.wait_label = _hint()
        self.wait_label.setWordWrap(True)
        self.wait_label.setMinimumWidth(20)
        self.wait_label.setVisible(False)
        self.input = QPlainTextEdit()
        self.input.setMaximumHeight(110)
        button_row = QWidget()
        buttons = FlowLayout(button_row)  # wraps in a narrow window instead of cutting labels
        self.send_button = QPushButton(icon("send"), "Send")
        self.send_button.setObjectName("Primary")
        self.stop_button = QPushButton(icon("stop"), "Stop")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.regen_button = QPushButton(icon("regenerate"), "Regenerate")
        self.regen_button.setToolTip("A new version of the last reply (earlier ones are kept)")
        self.edit_button = QPushButton(icon("edit"), "Edit last")
        self.edit_button.setToolTip("Edit your last message: it is replaced when you send "
                                    "(Esc puts things back)")
        self.continue_button = QPushButton(icon("send"), "Continue")
        self.continue_button.setToolTip("The reply stopped at its token limit: write more "
                                        "of it")
        self.export_button = QPushButton(icon("export"), "Export")
        self.export_menu = QMenu(self.export_button)
        self.export_button.setMenu(self.export_menu)
        self.context_label = _hint()
        self.context_label.setToolTip("Tokens this chat sends the model, against the "
                                      "context it may use")
        self.model_label = _hint("No chat model loaded")
        self.model_label.setMinimumWidth(40)
        self.model_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        for b in (self.send_button, self.stop_button, self.continue_button, self.regen_button,
                  self.edit_button):
            buttons.addWidget(b)
        buttons.add_stretch()
        buttons.addWidget(self.export_button)
        info = QHBoxLayout()  # the model and the indicator: a row of their own, never squeezed
        info.addWidget(self.model_label, 1)
        info.addWidget(self.context_label)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.wait_label)
        lay.addLayout(info)
        lay.addWidget(self.input)
        lay.addWidget(button_row)


class ChatSettings(QWidget):
    """The chat's own system prompt and context policy, and the sampling settings."""

    def __init__(self, sampling: dict, parent: QWidget | None = None):
        super().__init__(parent)
        rv = QVBoxLayout(self)
        rv.setContentsMargins(0, 0, 0, 0)
        sys_box = QGroupBox("System prompt (this chat)")
        sv = QVBoxLayout(sys_box)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setMaximumHeight(120)
        self.default_button = QPushButton("Make this the default")
        self.default_button.setToolTip("New chats start with this system prompt")
        sv.addWidget(self.system_prompt)
        sv.addWidget(self.default_button)
        ctx_box = QGroupBox("Context (this chat)")
        cv = QVBoxLayout(ctx_box)
        self.policy_combo = QComboBox()
        for key, name in POLICIES.items():
            self.policy_combo.addItem(name, key)
            self.policy_combo.setItemData(self.policy_combo.count() - 1, POLICY_TIPS[key],
                                          Qt.ItemDataRole.ToolTipRole)
        self.policy_combo.setToolTip("What happens when the chat outgrows the context")
        self.fit_note = _hint()
        self.fit_note.setWordWrap(True)
        self.fit_note.setVisible(False)
        cv.addWidget(self.policy_combo)
        cv.addWidget(self.fit_note)
        samp_box = QGroupBox("Sampling")
        sb = QVBoxLayout(samp_box)
        self.sampling = SamplingPanel(sampling)
        sb.addWidget(self.sampling)
        rv.addWidget(sys_box)
        rv.addWidget(ctx_box)
        rv.addWidget(samp_box)
        rv.addStretch(1)
