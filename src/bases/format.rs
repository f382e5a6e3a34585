//! How a base's System One questions are put to the model: the prompt's
//! format, the yes/no rendering and the question types' temperatures, as
//! the reference decisio's bases set them (`decisio/families.py`).

/// How a yes/no question is put to the model (`--noul-rendering`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NoulRendering {
    /// In words, read from ` yes` and ` no`.
    Words,
    /// A two-option letter choice, the false side first, each side shown as
    /// its description.
    Letters,
    /// As `Letters`, each side named: `No: <false>`, `Yes: <true>`.
    LettersKeys,
}

/// Where a question's answer is read (`ANSWER_SLOTS` of the reference's
/// `decisio/readout/letters.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AnswerSlot {
    /// After `Answer:`, prefilled after the chat template's generation
    /// prompt; the labels are read in their spaced form (` A`).
    Prefill,
    /// At the template's own first assistant position, right after its
    /// generation prompt; the labels' bare form (`A`) is the one written.
    Template,
}

/// Which tokens a label is read from (`LABEL_VARIANTS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LabelVariants {
    /// One token a label, the form its slot reads.
    Single,
    /// Every single-token form of a label (` A` and `A`, a byte-fallback
    /// token where the tokenizer has one; for yes/no also ` Yes` and
    /// `Yes`), their probabilities summed per label.
    Summed,
}

/// The user turn's layout (`LAYOUTS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// The state, a blank line, the question.
    Plain,
    /// The request's questions listed first (`layout_header`), then the
    /// state and the question as plain.
    Header,
}

/// How a base's System One questions are put to the model: the fields of
/// the reference's `PromptFormat` that its bases set (`decisio/families.py`:
/// `system_prompt`, `answer_slot`, `label_variants`, `layout`; the spaced
/// tail is every base's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptFormat {
    /// A system turn before the question (`text_route::systemone::SYSTEM_PROMPT`).
    pub system_turn: bool,
    pub slot: AnswerSlot,
    pub variants: LabelVariants,
    pub layout: Layout,
}

impl PromptFormat {
    /// The Qwen base's format, which the reference also gives a model of no
    /// base of its own: no system turn, `Answer:` prefilled, one token a
    /// label, the plain layout.
    pub const QWEN: PromptFormat = PromptFormat {
        system_turn: false,
        slot: AnswerSlot::Prefill,
        variants: LabelVariants::Single,
        layout: Layout::Plain,
    };

    /// The Gemma bases' format (`GEMMA4` and `GEMMA4_31B`): a system turn,
    /// the template's answer slot, every form of a label summed, and the
    /// header layout, which the reference serves on these bases unless a
    /// task or adapter fitted under the plain one holds it there (none does
    /// here; `docs/design/systemone.md`).
    pub const GEMMA: PromptFormat = PromptFormat {
        system_turn: true,
        slot: AnswerSlot::Template,
        variants: LabelVariants::Summed,
        layout: Layout::Header,
    };

    /// Whether the letter codes must be one token in their bare form (`A`)
    /// rather than their spaced one (` A`): only where the bare form is the
    /// one read alone (`PromptFormat.label_form` of the reference).
    pub fn bare_codes(&self) -> bool {
        self.variants == LabelVariants::Single && self.slot == AnswerSlot::Template
    }

    /// This format with each setting given replacing its own (`decisio
    /// serve --system-prompt`, `--answer-slot`, `--label-variants`,
    /// `--layout`).
    pub fn with(
        self,
        system_turn: Option<bool>,
        slot: Option<AnswerSlot>,
        variants: Option<LabelVariants>,
        layout: Option<Layout>,
    ) -> PromptFormat {
        PromptFormat {
            system_turn: system_turn.unwrap_or(self.system_turn),
            slot: slot.unwrap_or(self.slot),
            variants: variants.unwrap_or(self.variants),
            layout: layout.unwrap_or(self.layout),
        }
    }
}

/// A base's System One settings (`decisio/families.py`): the prompt's
/// format, how yes/no questions are asked and the temperatures of each
/// question type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WireSettings {
    pub format: PromptFormat,
    pub noul: NoulRendering,
    /// Choice questions' temperature.
    pub choice_temperature: f64,
    /// Yes/no and score questions' temperature.
    pub temperature: f64,
}

impl WireSettings {
    /// The temperature of a choice question, or of a yes/no or score one.
    pub fn temperature_of(&self, choice: bool) -> f64 {
        if choice {
            self.choice_temperature
        } else {
            self.temperature
        }
    }

    /// The reference's served defaults (its Qwen base's settings, which it
    /// also gives a model of no base of its own, such as the fixture).
    pub const SERVED: WireSettings = WireSettings {
        format: PromptFormat::QWEN,
        noul: NoulRendering::LettersKeys,
        choice_temperature: 1.370,
        temperature: 1.506,
    };
}
