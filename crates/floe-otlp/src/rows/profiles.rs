//! Profiles → rows of `otel_profiles`: one row per sample, every index resolved through the
//! record's dictionary ([`crate::profiles::Dictionary`]), the stack as parallel lists leaf
//! first, and the stack's hash.

use opentelemetry_proto::tonic::profiles::v1development::{ProfilesData, ValueType};

use super::*;
use crate::profiles::{Dictionary, Frame, stack_hash};

impl TableBuilders {
    /// Appends every sample of every profile; returns how many.
    pub fn append_profiles(&mut self, data: &ProfilesData, from: &Lineage<'_>) -> usize {
        let d = Dictionary::of(data);
        let (columns, team) = self.columns_and_team(OtlpTable::Profiles);
        let mut item = 0;
        let mut frames: Vec<Frame<'_>> = Vec::new();
        let type_of = |t: Option<&ValueType>| {
            t.map_or(("", ""), |t| {
                (d.string(t.type_strindex), d.string(t.unit_strindex))
            })
        };
        for rp in &data.resource_profiles {
            let promoted = Promoted::of(rp.resource.as_ref(), team);
            for sp in &rp.scope_profiles {
                let context = Context {
                    resource: rp.resource.as_ref(),
                    resource_schema_url: &rp.schema_url,
                    scope: sp.scope.as_ref(),
                    scope_schema_url: &sp.schema_url,
                    promoted: &promoted,
                };
                for p in &sp.profiles {
                    let (sample_type, sample_unit) = type_of(p.sample_type.as_ref());
                    let (period_type, period_unit) = type_of(p.period_type.as_ref());
                    let profile_attributes = d.attributes(&p.attribute_indices);
                    for s in &p.samples {
                        let time = s
                            .timestamps_unix_nano
                            .first()
                            .copied()
                            .unwrap_or(p.time_unix_nano);
                        frames.clear();
                        frames.extend(d.frames(s.stack_index));
                        let link = d.link(s.link_index);
                        let mut row = columns.row();
                        row.ts(Some(time));
                        row.nanos_opt(time);
                        row.id(&p.profile_id);
                        row.nanos_opt(p.time_unix_nano);
                        row.long((p.duration_nano != 0).then_some(p.duration_nano as i64));
                        row.text(sample_type);
                        row.text(sample_unit);
                        row.text(period_type);
                        row.text(period_unit);
                        row.long((p.period != 0).then_some(p.period));
                        row.long(Some(
                            s.values.iter().fold(0i64, |a, v| a.saturating_add(*v)),
                        ));
                        row.signed_longs(s.values.iter().copied());
                        row.signed_longs(s.timestamps_unix_nano.iter().map(|t| *t as i64));
                        row.id(link.map_or(&[][..], |l| l.trace_id.as_slice()));
                        row.id(link.map_or(&[][..], |l| l.span_id.as_slice()));
                        row.attributes(&d.attributes(&s.attribute_indices));
                        row.attributes(&profile_attributes);
                        row.str(Some(&stack_hash(frames.iter().copied())));
                        row.strs(frames.iter().map(|f| f.function));
                        row.strs(frames.iter().map(|f| f.file));
                        row.signed_longs(frames.iter().map(|f| f.line));
                        row.strs(frames.iter().map(|f| f.mapping_file));
                        row.signed_longs(frames.iter().map(|f| f.address as i64));
                        row.text(&p.original_payload_format);
                        row.uint(p.dropped_attributes_count);
                        context.append(&mut row);
                        lineage(&mut row, from, item);
                        item += 1;
                    }
                }
            }
        }
        item as usize
    }
}
